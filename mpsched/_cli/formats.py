"""How the command line writes counts, sizes, durations and times: ``2 processes``,
``1.2 MiB``, ``4 min 05 s``, ``due in 3 h 02 min (2026-12-03T09:28:11+01:00)``."""

from __future__ import annotations

from datetime import datetime


def plural(count: int, noun: str) -> str:
    """``1 process``, ``2 processes``, ``0 workers``."""
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun}{'es' if noun.endswith(('s', 'x', 'ch', 'sh')) else 's'}"


def format_size(size: int) -> str:
    """``512 bytes``, ``12.0 KiB``, ``1.2 MiB``, ``3.4 GiB``."""
    if size < 1024:
        return f"{size} bytes"
    value, units = size / 1024, ["KiB", "MiB", "GiB"]
    while value >= 1024 and len(units) > 1:
        value /= 1024
        units.pop(0)
    return f"{value:.1f} {units[0]}"


def format_due(due_in: float | None, now: float) -> str:
    """``due in 3 h 02 min (2026-12-03T09:28:11+01:00)`` or ``overdue by 1.2 s (...)``:
    the wait, then the local wall-clock time; "-" for no job."""
    if due_in is None:
        return "-"
    wait = (
        f"due in {format_duration(due_in)}"
        if due_in >= 0
        else f"overdue by {format_duration(-due_in)}"
    )
    when = local_time(now + due_in)
    return wait if when is None else f"{wait} ({when})"


def local_time(epoch: float) -> str | None:
    """``2026-12-03T09:28:11+01:00``; None past the year 9999 (no date to show)."""
    try:
        return datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return None


def format_duration(seconds: float) -> str:
    """``350 ms``, ``1.2 s``, ``4 min 05 s``, ``3 h 02 min``, ``12 d 04 h``; capped at a
    century, so that no time prints as a 300-digit number."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds >= 100 * 365.25 * 86400:
        return "more than 100 years"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours:02d} h"
