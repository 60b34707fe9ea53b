"""The import graph runs one way: each module imports only modules of a lower layer.

A layer is a package (``mpsched._core``, ``mpsched._store``, ...), and inside a package a
group of its modules. A module may import any module of a lower package, and the modules of
its own package that sit in a lower group. An import inside a function, or an ``Any`` that
hides one, does not get around this test: every ``mpsched.*`` import anywhere in a module's
source counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "mpsched"

# The map of mpsched, lowest first: (package, its modules lowest first). The same group is
# a cycle waiting to happen, so modules of one group never import each other.
LAYERS: list[tuple[str, list[set[str]]]] = [
    ("_errors", [{"base"}, {"jobs", "connection", "store"}]),  # the error tree, by family
    (
        "_core",
        [
            {"options", "histogram", "retrying", "progress", "job_checks"},
            {"job"},
            {"clock", "recurring", "limits", "result_of", "dependencies"},
            {"leases", "heap", "planning", "wall_offset", "run_window"},
            {"queues"},
            {"room", "admission", "queue_like"},
            {"prefetch"},
            {"hand_out"},
            {"intake"},
            {"lookups"},
            {"queue"},
        ],
    ),
    (
        "_store",
        [
            {
                "base",
                "commit",
                "pruning",
                "lease_records",
                "group_sync",
                "redis.url",
                "redis.records",
                "redis.script_runner",
            },
            {
                "op_queue",
                "statements",
                "readers",
                "lease_log",
                "memory",
                "file",
                "redis.server",
                "redis.scripts",
                "redis.views",
            },
            {"writer", "redis.subscription"},
            {"deferred_leases", "job_rows", "recovery", "schedule_rows", "redis.session"},
            {
                "redis.schedules",
                "redis.cancels",
                "redis.membership",
                "redis.job_changes",
                "redis.listings",
            },
            {"sqlite", "redis.store"},
        ],
    ),
    (
        "_transport",
        [
            {"address", "authkey", "wire", "handshake"},
            {"tls", "handshake_loop"},
            {"connect", "http_access"},
            {"sockets"},
            {"runtime"},
        ],
    ),
    ("_protocol", [{"records", "closing"}, {"codec"}, {"proxy"}]),
    ("_payload", [{"frames", "by_value"}, {"shm"}, {"segment_pool", "segments"}, {"pickling"}]),
    (
        "_worker",
        [
            {"stop_reasons", "claims", "reports", "process", "context", "window_file"},
            {"run", "slot_file"},
            {"loop", "pool_slots"},
            {"remote"},
            {"pool"},
        ],
    ),
    (
        "_manager",
        [
            {
                "retained",
                "mailbox",
                "worker_table",
                "launcher",
                "failures",
                "http.metrics",
                "http.history",
                "http.connections",
                "wall_clock",
                "store_outage",
                "client_connections",
                "shared_fence",
                "retries",
            },
            {"shared_leases", "shared_waits", "shared_payloads", "shared_listing", "http.intake"},
            {"shared_doubts", "shared_give_backs", "http.answering"},
            {"shared_prefetch"},
            {"shared_takers", "shared_cancels"},
            {"shared_queue"},
            {"journal", "schedule_entry", "shared_submits", "versions"},
            {"schedule_runs", "store_journal", "no_journal", "endings", "workflows"},
            {"schedule_events"},
            {"schedules", "shared_journal"},
            {"dispatch", "submissions", "client_sessions", "inspection", "manager_stop"},
            {"worker_sessions"},
            {"service_parts"},
            {"service", "shared_link"},
            {"supervisor", "http.views"},
            {"http.routes"},
            {"http.server"},
            {"serving"},
            {"main"},
        ],
    ),
    (
        "_client",
        [
            {"job_future", "outbox", "link", "store_failures"},
            {"outage", "schedule_handle", "future_table", "dialing"},
            {"results", "cancels", "watches", "unsent"},
            {"core"},
            {"known_limits", "lookups", "closing"},
            {"recurring", "submit_path", "forever"},
            {"dependents", "manager_closing", "manager_calls"},
            {"client"},
            {"scheduler"},
        ],
    ),
    (
        "_cli",
        [
            {"values", "formats", "managers"},
            {"options", "stress_report"},
            {
                "query_options",
                "serve_options",
                "submit_options",
                "stress_options",
                "stress_producers",
            },
            {"parser", "connection"},
            {"demo", "stress", "serve", "jobs", "status", "drain"},
            {"schedules", "stress_shared"},
            {"main"},
        ],
    ),
    ("", [{"__init__", "__main__"}]),  # the public API and ``python -m mpsched``
]


def _name(path: Path) -> str:
    """``mpsched._core.queue`` for mpsched/_core/queue.py, ``mpsched._errors``, ``mpsched``."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _rank() -> dict[str, tuple[int, int]]:
    """Each module's (package layer, group within its package)."""
    rank = {}
    for i, (package, groups) in enumerate(LAYERS):
        for j, group in enumerate(groups):
            if not package:
                rank.update({"mpsched": (i, j), "mpsched.__main__": (i, j)})
                continue
            if not group:
                rank[f"mpsched.{package}"] = (i, j)
            for module in group:
                rank[f"mpsched.{package}.{module}"] = (i, j)
    return rank


def _modules() -> dict[str, Path]:
    return {
        _name(p): p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent == PACKAGE
    }


def _imports(module: Path, known: set[str]) -> set[str]:
    """The mpsched modules ``module`` imports (``from mpsched._payload import shm`` is
    mpsched._payload.shm; importing a subpackage itself counts as its lowest module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and (node.module == "mpsched" or node.module.startswith("mpsched."))
        ):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                names.add(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("mpsched."))
    return names


def test_every_module_has_a_layer() -> None:
    assert set(_modules()) == set(_rank()), set(_modules()) ^ set(_rank())


def test_every_subpackage_says_what_it_is_for_and_may_import() -> None:
    for package, _groups in LAYERS[1:-1]:
        doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text()))
        assert doc and "May import" in doc, package


def test_imports_only_go_down() -> None:
    rank = _rank()
    # a subpackage itself (its __init__ holds only a docstring) ranks below its modules
    rank.update(
        {
            f"mpsched.{package}": (i, -1)
            for i, (package, _) in enumerate(LAYERS)
            if package and f"mpsched.{package}" not in rank
        }
    )
    upward = [
        f"{name} imports {imported}"
        for name, path in _modules().items()
        for imported in _imports(path, set(rank))
        if rank[imported] >= rank[name]
    ]
    assert not upward


def test_the_pure_core_never_imports_multiprocessing() -> None:
    for path in (PACKAGE / "_core").glob("*.py"):
        tree = ast.parse(path.read_text())
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        outside = {
            m
            for m in modules
            if m
            and (
                m.startswith("multiprocessing")
                or (
                    m.startswith("mpsched")
                    and not m.startswith(("mpsched._core", "mpsched._errors"))
                )
            )
        }
        assert not outside, (path.name, outside)
