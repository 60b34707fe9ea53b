"""Limits: how many jobs of one kind may run at once, and start per time window.

A limit is declared on the manager by name (``Scheduler(limits={"exports": 2})``) and a
job names one (``limit="exports"``). Its forms, as text: ``N`` (at most N running at
once), ``N/s``, ``N/m``, ``N/h`` (at most N starts in any window of that length), and
``N,M/s`` (both). Admission happens where a job is handed out, under the queue's lock:
a due job whose limit is full is *parked* (mpsched._core.queues) and comes back when a
slot frees or a rate window opens. Nothing scans or polls.

No lock of its own: JobQueue's parts call it with the queue's lock held.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

from mpsched._core.job import check_name
from mpsched._errors import InvalidJobError

WINDOWS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_FORM = re.compile(r"\s*(?:(\d+)\s*,\s*)?(\d+)\s*(?:/\s*([smh]))?\s*")


@dataclass(frozen=True)
class LimitSpec:
    """One limit: at most ``concurrency`` jobs running at once, and at most ``rate[0]``
    starts in any ``rate[1]`` seconds; None: no such bound."""

    concurrency: int | None = None
    rate: tuple[int, float] | None = None

    def __str__(self) -> str:
        parts = [] if self.concurrency is None else [str(self.concurrency)]
        if self.rate is not None:
            unit = next(u for u, s in WINDOWS.items() if s == self.rate[1])
            parts.append(f"{self.rate[0]}/{unit}")
        return ",".join(parts)


def parse_rate(rate: object) -> tuple[int, float] | None:
    """``"10/s"`` as (10, 1.0); None stays None.

    Raises:
        InvalidJobError: not of the form N/s, N/m or N/h with N >= 1.
    """
    if rate is None:
        return None
    match = _FORM.fullmatch(rate) if isinstance(rate, str) else None
    if (
        match is None
        or match.group(1) is not None
        or match.group(3) is None
        or int(match.group(2)) < 1
    ):
        raise InvalidJobError(f"a rate is N/s, N/m or N/h with N >= 1, not {rate!r}")
    return int(match.group(2)), WINDOWS[match.group(3)]


def parse_limit(name: str, form: object) -> LimitSpec:
    """A limit's form (``2``, ``"2"``, ``"10/s"``, ``"2,10/s"``, or a LimitSpec) as a spec.

    Raises:
        InvalidJobError: a bad name or form, or a bound below 1.
    """
    check_name("limit", name)
    if isinstance(form, LimitSpec):
        spec = form
    elif isinstance(form, int) and not isinstance(form, bool):
        spec = LimitSpec(concurrency=form)
    else:
        match = _FORM.fullmatch(form) if isinstance(form, str) else None
        if match is None or (match.group(1) is not None and match.group(3) is None):
            raise InvalidJobError(
                f"limit {name}: the forms are N, N/s, N/m, N/h and N,M/s, not {form!r}"
            )
        count = int(match.group(2))
        if match.group(3) is None:
            spec = LimitSpec(concurrency=count)
        else:
            spec = LimitSpec(
                concurrency=None if match.group(1) is None else int(match.group(1)),
                rate=(count, WINDOWS[match.group(3)]),
            )
    if (spec.concurrency is not None and spec.concurrency < 1) or (
        spec.rate is not None and spec.rate[0] < 1
    ):
        raise InvalidJobError(f"limit {name}: bounds must be at least 1, not {form!r}")
    return spec


def parse_limits(limits: object) -> dict[str, LimitSpec]:
    """``{"exports": 2, "api": "10/s"}`` (or ``["exports=2", ...]``) as specs by name.

    Raises:
        InvalidJobError: a bad name or form.
    """
    if limits is None:
        return {}
    if isinstance(limits, (list, tuple)):
        pairs: dict[str, object] = {}
        for item in limits:
            name, sep, form = str(item).partition("=")
            if not sep:
                raise InvalidJobError(f"a limit is NAME=FORM (exports=2), not {item!r}")
            pairs[name.strip()] = form.strip()
        limits = pairs
    if not isinstance(limits, dict):
        raise InvalidJobError(f"limits must be a dict of name to form, not {limits!r}")
    return {name: parse_limit(name, form) for name, form in limits.items()}


def unknown_limit(name: str, known: object) -> InvalidJobError:
    """The error for a job naming a limit the manager does not know."""
    names = ", ".join(sorted(known)) if known else "none"  # type: ignore[call-overload]
    return InvalidJobError(f"unknown limit {name!r}: the manager knows {names}")


class _Counter:
    """One limit's running jobs and recent starts."""

    __slots__ = ("running", "spec", "starts")

    def __init__(self, spec: LimitSpec) -> None:
        self.spec = spec
        self.running = 0
        self.starts: deque[float] = deque()  # start instants within the rate's window


class Limits:
    """The manager's limits and their counters; called with the queue's lock held."""

    def __init__(self, specs: dict[str, LimitSpec] | None = None) -> None:
        self._counters = {name: _Counter(spec) for name, spec in (specs or {}).items()}

    def __bool__(self) -> bool:
        return bool(self._counters)

    def __contains__(self, name: str) -> bool:
        return name in self._counters

    def names(self) -> list[str]:
        return sorted(self._counters)

    def specs(self) -> dict[str, LimitSpec]:
        return {name: c.spec for name, c in self._counters.items()}

    def set_locked(self, name: str, spec: LimitSpec | None) -> None:
        """Declare, change or (None) remove a limit; running counts are kept."""
        if spec is None:
            self._counters.pop(name, None)
            return
        counter = self._counters.get(name)
        if counter is None:
            self._counters[name] = _Counter(spec)
        else:
            counter.spec = spec

    def check(self, name: str | None) -> None:
        """Raises InvalidJobError (:func:`unknown_limit`) if ``name`` is not declared."""
        if name is not None and name not in self._counters:
            raise unknown_limit(name, self._counters)

    def admit_locked(self, name: str, now: float) -> bool:
        """Take a slot of ``name`` for a job that starts now; False when full. A limit
        removed meanwhile admits everything."""
        counter = self._counters.get(name)
        if counter is None:
            return True
        spec = counter.spec
        if spec.concurrency is not None and counter.running >= spec.concurrency:
            return False
        if spec.rate is not None:
            count, window = spec.rate
            starts = counter.starts
            while starts and starts[0] <= now - window:
                starts.popleft()
            if len(starts) >= count:
                return False
            starts.append(now)
        counter.running += 1
        return True

    def hold_locked(self, name: str) -> None:
        """A job of ``name`` that was running before a restart still runs: it holds a
        slot, whether or not the limit has room for it now."""
        counter = self._counters.get(name)
        if counter is not None:
            counter.running += 1

    def ended_locked(self, name: str) -> None:
        """A job of ``name`` ended (or was taken back): its slot is free."""
        counter = self._counters.get(name)
        if counter is not None and counter.running > 0:
            counter.running -= 1

    def free_locked(self, name: str, now: float) -> int:
        """How many jobs of ``name`` could start now (a large number for no bound)."""
        counter = self._counters.get(name)
        if counter is None:
            return 1 << 30
        spec = counter.spec
        free = 1 << 30
        if spec.concurrency is not None:
            free = spec.concurrency - counter.running
        if spec.rate is not None:
            count, window = spec.rate
            recent = sum(1 for start in counter.starts if start > now - window)
            free = min(free, count - recent)
        return max(0, free)

    def opens_locked(self, name: str, now: float) -> float | None:
        """When the rate window of ``name`` next has room, if it is full now (None: it
        has room, or no rate)."""
        counter = self._counters.get(name)
        if counter is None or counter.spec.rate is None:
            return None
        count, window = counter.spec.rate
        recent = [start for start in counter.starts if start > now - window]
        if len(recent) < count:
            return None
        return recent[-count] + window

    def running_locked(self, name: str) -> int:
        counter = self._counters.get(name)
        return 0 if counter is None else counter.running

    def rated_locked(self, name: str) -> bool:
        counter = self._counters.get(name)
        return counter is not None and counter.spec.rate is not None
