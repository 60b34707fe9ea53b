"""The parts of the documentation that are generated, so that they cannot drift.

An MkDocs hook (``mkdocs.yml``: ``hooks``). A page asks for a part with a marker line:

- ``<!-- generated: cli -->``: every command of ``python -m mpsched``, its options and exit
  codes, read from the argparse parser that ``--help`` prints;
- ``<!-- generated: benchmark-method -->`` and ``<!-- generated: benchmark-targets -->``:
  the method and the targets table of ``benchmarks/README.md``, as ``benchmarks/run.py``
  last wrote it.

It also checks each test a page names as ``tests/FILE.py::NAME``: a file or test that does
not exist is a warning, which ``mkdocs build --strict`` turns into a failure.
"""

from __future__ import annotations

import argparse
import ast
import logging
import re
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks" / "README.md"
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)
TEST_REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")

log = logging.getLogger("mkdocs.plugins.mpsched")


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Replace each marker of ``markdown`` with its part; check its test references."""
    where = page.file.src_uri
    for path, name in TEST_REFERENCE.findall(markdown):
        problem = test_problem(path, name)
        if problem:
            log.warning("%s names `%s::%s`: %s", where, path, name, problem)

    def part(match: re.Match[str]) -> str:
        maker = PARTS.get(match.group(1))
        if maker is None:
            log.warning("%s asks for an unknown generated part %r", where, match.group(1))
            return match.group(0)
        return maker()

    return MARKER.sub(part, markdown)


def test_problem(path: str, name: str) -> str:
    """Why ``tests/...py::name`` names no test ('' when it names one)."""
    names = _test_names(path)
    if names is None:
        return "no such file"
    return "" if name in names else "no such test function or class in it"


@cache
def _test_names(path: str) -> frozenset[str] | None:
    file = ROOT / path
    if not file.is_file():
        return None
    tree = ast.parse(file.read_text(), str(file))
    return frozenset(
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    )


# --- the command line ------------------------------------------------------------------


def cli_reference() -> str:
    """Every command of the parser: usage, options, example and exit codes."""
    from mpsched._cli.parser import EXIT_MEANINGS, build_parser

    parser = build_parser()
    lines = ["## Exit codes", "", "| code | meaning |", "|---:|---|"]
    lines += [f"| {int(code)} | {_cell(meaning)} |" for code, meaning in EXIT_MEANINGS.items()]
    lines += ["", "## Options of every command", "", *_options(parser, "python -m mpsched")]
    for name, command in parser.commands.items():
        lines += [
            "",
            f"## {name}",
            "",
            _cell(command.description or ""),
            "",
            "```text",
            command.format_usage().strip(),
            "```",
            "",
            *_options(command, f"python -m mpsched {name}"),
        ]
        if command.epilog:
            lines += ["", "```text", command.epilog.strip(), "```"]
    return "\n".join(lines)


def _options(parser: argparse.ArgumentParser, prog: str) -> list[str]:
    formatter = parser._get_formatter()
    rows = ["| option | what |", "|---|---|"]
    for group in parser._action_groups:
        for action in group._group_actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
                continue
            rows.append(f"| {_invocation(action)} | {_cell(formatter._expand_help(action))} |")
    return rows if len(rows) > 2 else [f"`{prog}` takes no options."]


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    value = ""
    if action.nargs != 0:
        metavar = action.metavar or (
            "{" + ",".join(map(str, action.choices)) + "}"
            if action.choices
            else action.dest.upper()
        )
        value = f" {metavar}" if action.nargs in (None, 1) else f" {metavar} ..."
    return ", ".join(f"`{flag}{value}`" for flag in action.option_strings)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# --- the benchmarks ----------------------------------------------------------------------


def _benchmark_section(start: str, end: str) -> str:
    text = BENCHMARKS.read_text()
    begin = text.index(start)
    return text[begin : text.index(end, begin + len(start))].strip()


def benchmark_method() -> str:
    """The benchmarks' method, as ``benchmarks/README.md`` says it."""
    section = _benchmark_section("## Method, and what each number means", "\n## Results")
    return section.replace("## Method, and what each number means", "## Method", 1)


def benchmark_targets() -> str:
    """The targets table of the latest run, with the run's date and machine."""
    results = _benchmark_section("<!-- results:begin -->", "<!-- results:end -->")
    head = results[len("<!-- results:begin -->") : results.index("### Targets")].strip()
    targets = results[results.index("### Targets") :]
    targets = targets[: targets.index("\n### ", len("### Targets"))]
    return f"{head}\n\n{targets.replace('### Targets', '## Targets', 1).strip()}"


PARTS = {
    "cli": cli_reference,
    "benchmark-method": benchmark_method,
    "benchmark-targets": benchmark_targets,
}
