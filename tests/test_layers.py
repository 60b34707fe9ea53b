"""The import graph runs one way: each module imports only modules of a lower layer.

An import inside a function, or an ``Any`` that hides one, does not get around this test:
every ``mpsched._x`` import anywhere in a module's source counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "mpsched"

# Lowest first. A module may import modules of lower layers only (the same layer is a
# cycle waiting to happen, except where listed as one module's helper below).
LAYERS: list[set[str]] = [
    {"_errors"},
    {"_job"},
    {"_shm", "_by_value"},
    {"_segment_pool"},
    {"_authkey"},  # its private-file check serves _tls's key files too
    {"_tls", "_wire", "_handshake", "_payload", "_store", "_recurring"},
    {"_handshake_loop"},
    {"_transport"},
    {"_runtime"},
    {"_protocol"},
    {"_clock"},
    {"_leases", "_heap"},
    {"_store_memory", "_store_writer", "_store_leases"},
    {"_store_file"},
    {"_store_sqlite"},
    {"_ended"},
    {"_queue", "_mailbox", "_outbox", "_segments", "_job_future"},
    {"_link"},
    {"_outage"},
    {"_journal", "_schedule_entry"},
    {"_schedules"},
    {"_workers"},
    {"_service"},
    {"_worker"},
    {"_supervisor", "_remote"},
    {"_manager", "_manager_process"},
    {"_futures"},
    {"_schedule"},
    {"_client"},
    {"_scheduler"},
    {"_cli_parser"},
    {"_demo", "_stress", "_serve", "_cli_jobs"},
    {"_cli_schedules"},
    {"_cli"},
    {"__main__", "__init__"},
]


def _imports(module: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mpsched."):
            names.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            names.update(a.name.split(".")[1] for a in node.names
                         if a.name.startswith("mpsched."))
    return names


def test_every_module_has_a_layer() -> None:
    layered = set().union(*LAYERS)
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert modules == layered, (modules - layered, layered - modules)


def test_imports_only_go_down() -> None:
    layer_of = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    upward = [f"{p.stem} imports {name}" for p in PACKAGE.glob("*.py")
              for name in _imports(p) if layer_of[name] >= layer_of[p.stem]]
    assert not upward


def test_the_pure_queue_never_imports_multiprocessing() -> None:
    for name in ("_job", "_clock", "_leases", "_heap", "_queue"):
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
                    for a in n.names}
        assert not {m for m in modules if m and m.startswith(("multiprocessing", "mpsched._p",
                                                             "mpsched._t"))}, name
