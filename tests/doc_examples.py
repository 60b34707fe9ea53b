"""The examples of README.md and docs/: every ```python and ```sh block, with how to run it.

A block runs as it is unless the line before it is a marker (an HTML comment, which no
reader sees):

- ``<!-- example: skip REASON -->``: not run; the reason says why (a remote host, ...);
- ``<!-- example: file NAME -->``: written to NAME for the blocks after it, not run;
- ``<!-- example: background -->``: started, and left running until the page's last block
  has run; it must print a line once it is ready, and exit 0 on SIGTERM;
- ``<!-- example: tested-by tests/FILE.py::NAME -->``: run, with more checks, by that test.

The blocks of one page run in order, in one directory of their own
(tests/test_docs_examples.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LANGUAGES = {"python": "python", "sh": "sh", "bash": "sh", "shell": "sh"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"<!-- example: (\S+)\s*(.*?)\s*-->\s*$")


class How(str, Enum):
    """How a block runs."""

    RUN = "run"
    SKIP = "skip"
    FILE = "file"
    BACKGROUND = "background"
    TESTED_BY = "tested-by"


@dataclass(frozen=True)
class Example:
    """One code block of a page."""

    page: str  # relative to the repository
    line: int  # of its opening fence
    language: str  # "python" or "sh"
    source: str
    how: How
    argument: str  # the skip's reason, the file's name, the test's name


def pages() -> list[Path]:
    """README.md and every page of docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def examples(page: Path) -> list[Example]:
    """The python and sh blocks of ``page``, in order."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        language = LANGUAGES.get(match.group(1))
        if language is None:
            continue
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.match(before.strip())
        how, argument = (How(marker.group(1)), marker.group(2)) if marker else (How.RUN, "")
        found.append(
            Example(
                page=str(page.relative_to(ROOT)),
                line=text.count("\n", 0, match.start()) + 1,
                language=language,
                source=match.group(2),
                how=how,
                argument=argument,
            )
        )
    return found


def problems(example: Example) -> list[str]:
    """What is wrong with a block's marker ([] when nothing)."""
    where = f"{example.page}:{example.line}"
    if example.how == How.SKIP and not example.argument:
        return [f"{where}: a skipped example must say why"]
    if example.how == How.FILE and not re.fullmatch(r"[\w.-]+\.py", example.argument):
        return [f"{where}: file needs a NAME.py"]
    if example.how == How.BACKGROUND and example.language == "sh" and len(commands(example)) != 1:
        return [f"{where}: a background shell example is one command"]
    if example.how == How.TESTED_BY and not re.fullmatch(
        r"tests/[\w/]+\.py::\w+", example.argument
    ):
        return [f"{where}: tested-by needs tests/FILE.py::NAME"]
    return []


def commands(example: Example) -> list[str]:
    """A shell block's command lines, comments and continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", example.source)
    return [
        line
        for line in (re.sub(r"\s+#.*$", "", raw).strip() for raw in joined.splitlines())
        if line and not line.startswith("#")
    ]
