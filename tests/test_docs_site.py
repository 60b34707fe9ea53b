"""The generated parts of the documentation site (docs/_hooks/generated.py) hold what they
are generated from: every command, option and exit code of the parser, and the benchmark
tables of benchmarks/README.md."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import ModuleType

from mpsched._cli.parser import EXIT_MEANINGS, build_parser

HOOK = Path(__file__).resolve().parent.parent / "docs" / "_hooks" / "generated.py"


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generated", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_has_every_command_option_and_exit_code() -> None:
    reference = _hook().cli_reference()
    parser = build_parser()
    for name, command in parser.commands.items():
        assert f"## {name}\n" in reference, name
        for action in command._actions:
            if action.help == argparse.SUPPRESS:
                continue
            for flag in action.option_strings:
                assert f"`{flag}" in reference, (name, flag)
    for code in EXIT_MEANINGS:
        assert f"| {int(code)} |" in reference, code


def test_the_benchmark_parts_are_the_targets_table_and_the_method() -> None:
    hook = _hook()
    targets = hook.benchmark_targets()
    assert "## Targets" in targets and "| goal | measured | met |" in targets
    assert "## Method" in hook.benchmark_method()


def test_a_test_named_on_a_page_must_exist() -> None:
    hook = _hook()
    name = "test_a_test_named_on_a_page_must_exist"
    assert hook.test_problem("tests/test_docs_site.py", name) == ""
    assert hook.test_problem("tests/test_docs_site.py", "no_such_test") != ""
    assert hook.test_problem("tests/no_such_file.py", "test_x") == "no such file"
