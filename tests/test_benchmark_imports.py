"""The benchmarks import only what mpsched still has: a module or name that moved fails
here, not months later in a benchmark run (the peers they import need the bench extras,
so each ``from mpsched... import`` is checked, not the whole module)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def missing_names(directory: Path) -> list[str]:
    """Each ``from mpsched... import name`` under ``directory`` that does not resolve."""
    missing = []
    for path in sorted(directory.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                "mpsched"
            ):
                continue
            assert node.module is not None
            try:
                module = importlib.import_module(node.module)
            except ImportError:
                missing.append(f"{path.name}: {node.module}")
                continue
            missing += [
                f"{path.name}: {node.module}.{alias.name}"
                for alias in node.names
                if not hasattr(module, alias.name)
                and not (
                    hasattr(module, "__path__")  # a package: the name may be a submodule
                    and importlib.util.find_spec(f"{node.module}.{alias.name}") is not None
                )
            ]
    return missing


def test_every_mpsched_name_a_benchmark_imports_exists() -> None:
    assert list(BENCHMARKS.glob("*.py")), BENCHMARKS
    assert missing_names(BENCHMARKS) == []


def test_a_moved_name_is_named(tmp_path: Path) -> None:
    (tmp_path / "old.py").write_text("from mpsched._store.sqlite import _FINISH_LEASED\n")
    (tmp_path / "gone.py").write_text("from mpsched._no_such_module import x\n")
    (tmp_path / "fine.py").write_text("from mpsched import Scheduler\nfrom mpsched import _core\n")
    assert missing_names(tmp_path) == [
        "gone.py: mpsched._no_such_module",
        "old.py: mpsched._store.sqlite._FINISH_LEASED",
    ]
