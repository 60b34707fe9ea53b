"""The managers of a shared (Redis) store, as ``status`` prints them: each with its host,
pid, address, how long ago its last heartbeat was, and its workers: those of the manager
that answers as they are now, the others' as of their last heartbeat (its age said)."""

from __future__ import annotations

from mpsched._protocol.records import ManagerStatus


def format_managers(managers: tuple[ManagerStatus, ...]) -> list[str]:
    """The ``managers`` lines of ``status`` (none for a manager without a shared store)."""
    if not managers:
        return []
    lines = [
        f"managers  {len(managers)} on the store",
        f"  {'id':<28} {'host':<16} {'pid':>7}  {'heartbeat':>10}  {'lease':>7}  address",
    ]
    for m in managers:
        lines.append(
            f"  {m.manager_id:<28} {m.host:<16} {m.pid:>7}  "
            f"{m.heartbeat_age:>6.1f} s ago  {m.lease_timeout:>5g} s  {m.address}"
        )
        seen = "now" if m.workers_age <= 0 else f"as of {m.workers_age:.1f} s ago"
        for w in m.workers:
            lines.append(
                f"    worker {w.worker_id:<10} pid {w.pid:<7} done {w.jobs_done:<6} "
                f"{'running ' + w.current_job if w.current_job else 'idle'}"
                f"  ({seen})"
            )
    return lines
