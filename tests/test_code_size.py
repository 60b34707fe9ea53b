"""The package's size proxies for readable code: no module of 450 lines or more, no class
over 300 lines, no function over 60 (as ruff format lays them out)."""

from __future__ import annotations

import ast
from pathlib import Path

import mpsched

PACKAGE = Path(mpsched.__file__).parent
MODULE_LINES, CLASS_LINES, FUNCTION_LINES = 450, 300, 60


def too_long(root: Path) -> list[str]:
    """Each module, class and function under ``root`` over its size."""
    found = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        name = path.relative_to(root.parent)
        if source.count("\n") >= MODULE_LINES:
            found.append(f"{name}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                limit = CLASS_LINES if isinstance(node, ast.ClassDef) else FUNCTION_LINES
                if lines > limit:
                    found.append(f"{name}:{node.lineno} {node.name}: {lines} lines")
    return found


def test_no_module_class_or_function_is_over_its_size() -> None:
    assert too_long(PACKAGE) == []


def test_the_check_names_what_is_over_its_size(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    statements = [f"        x{n} = {n}\n" for n in range(60)]
    fits = "class Fits:\n    def fits(self):\n" + "".join(statements[:59])  # 60 lines
    long = "class Long:\n    def long(self):\n" + "".join(statements)  # 61 lines
    (package / "fits.py").write_text(fits)
    (package / "long.py").write_text(long)
    assert too_long(package) == ["pkg/long.py:2 long: 61 lines"]
