"""Every example of README.md and docs/ runs (the markers are tests/doc_examples.py's).

The blocks of a page run in order, in a directory of their own, with a runtime directory
of their own (so ``serve`` there is this test's local manager, never the user's) and this
interpreter's ``python`` and ``mpsched`` first on the PATH. Every process a page starts is
killed with all it started when its test ends.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from doc_examples import ROOT, Example, How, commands, examples, pages, problems
from processes import Lines

RUN_TIMEOUT = 60.0  # seconds for one block; each takes a few on 2 busy cores
READY_TIMEOUT = 60.0  # for a background block's first line
PAGES = [
    pytest.param(page, id=str(page.relative_to(ROOT)))
    for page in pages()
    if any(e.how in (How.RUN, How.BACKGROUND) for e in examples(page))
]


def test_every_example_is_run_or_says_why_not() -> None:
    found = [example for page in pages() for example in examples(page)]
    assert found, "no example found"
    assert [p for example in found for p in problems(example)] == []


def test_each_example_tested_elsewhere_names_a_test_that_exists() -> None:
    for page in pages():
        for example in examples(page):
            if example.how != How.TESTED_BY:
                continue
            path, name = example.argument.split("::")
            tree = ast.parse((ROOT / path).read_text())
            defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
            assert name in defined, f"{example.page}:{example.line}: {example.argument}"


class Page:
    """Runs one page's blocks and stops what they started."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        runtime = workdir / "run"
        runtime.mkdir(mode=0o700)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MPSCHED_")}
        bin_dir = str(Path(sys.executable).parent)
        self.env = {
            **env,
            "XDG_RUNTIME_DIR": str(runtime),
            "PYTHONPATH": str(workdir),
            "PATH": os.pathsep.join([bin_dir, env.get("PATH", "")]),
            "PYTHONIOENCODING": "utf-8",
        }
        self.popens: list[subprocess.Popen[str]] = []
        self.background: list[tuple[Example, subprocess.Popen[str], Lines]] = []

    def _argv(self, example: Example, *, background: bool) -> list[str]:
        if example.language == "python":
            script = self.workdir / f"example_{example.line}.py"
            script.write_text(example.source)
            return [sys.executable, str(script)]
        if background:  # exec: the signal reaches the command itself
            return ["bash", "-c", f"exec {commands(example)[0]}"]
        return ["bash", "-e", "-o", "pipefail", "-c", example.source]

    def _start(self, argv: list[str]) -> subprocess.Popen[str]:
        popen = subprocess.Popen(
            argv,
            cwd=self.workdir,
            env=self.env,
            text=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.popens.append(popen)
        return popen

    def run(self, example: Example) -> None:
        where = f"{example.page}:{example.line}"
        if example.how == How.FILE:
            (self.workdir / example.argument).write_text(example.source)
        elif example.how == How.BACKGROUND:
            popen = self._start(self._argv(example, background=True))
            assert popen.stdout is not None
            lines = Lines(popen.stdout)
            try:
                lines.next(READY_TIMEOUT)
            except AssertionError:
                pytest.fail(
                    f"{where} printed nothing within {READY_TIMEOUT} s, or ended: {lines.seen}"
                )
            self.background.append((example, popen, lines))
        elif example.how == How.RUN:
            popen = self._start(self._argv(example, background=False))
            try:
                out, _ = popen.communicate(timeout=RUN_TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{where} did not end within {RUN_TIMEOUT} s")
            assert popen.returncode == 0, f"{where} exited {popen.returncode}:\n{out}"

    def stop_background(self) -> None:
        """SIGTERM each background block, the latest first; each must exit 0."""
        for example, popen, lines in reversed(self.background):
            popen.send_signal(signal.SIGTERM)
            try:
                code = popen.wait(RUN_TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{example.page}:{example.line} outlived SIGTERM")
            assert code == 0, f"{example.page}:{example.line} exited {code}: {lines.seen}"
        self.background = []

    def kill_all(self) -> None:
        for popen in self.popens:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, signal.SIGKILL)  # its session: all it started
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(10)
            if popen.stdout is not None:
                popen.stdout.close()


@pytest.fixture
def page_runner(tmp_path: Path) -> Iterator[Page]:
    runner = Page(tmp_path)
    yield runner
    runner.kill_all()


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_the_examples_of_a_page_run_in_order(page: Path, page_runner: Page) -> None:
    for example in examples(page):
        page_runner.run(example)
    page_runner.stop_background()


def test_the_readmes_links_lead_to_files_that_exist() -> None:
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets, "the README links to no page"
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert missing == []
