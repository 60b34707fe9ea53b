"""Planning recurring jobs: when a schedule's slots fall, and what to run next.

A schedule's *slots* are the instants its runs are planned for, as UTC epoch seconds (the
"label" of a slot; a run's job id is ``"{schedule id}@{label as ISO UTC}"``):

- ``every(interval, mode="rate")``: ``anchor + k * interval`` for k = 0, 1, 2 ... The
  manager maps labels to its monotonic clock with one offset taken when it loads the
  schedule, so wall-clock jumps do not move the runs of a running manager.
- ``every(interval, mode="delay")``: the next slot is ``interval`` after the previous run
  ended; there is no timeline to fall behind.
- ``cron(expr, tz=...)``: the instants cronsim gives for ``expr`` in zone ``tz`` (Debian
  cron's DST rules), mapped to the monotonic clock when armed and again if the wall clock
  jumps.

``plan()`` decides, at each trigger (a schedule begins, or its armed run started or
ended), which slot to arm and what was skipped (overlap) or missed (downtime, backlog). It
is plain arithmetic on labels, so it is tested with made-up times and no clock.
Nothing here imports multiprocessing or reads a clock.
"""

from __future__ import annotations

import hashlib
import math
from datetime import timezone
from typing import NamedTuple

from mpsched._core.options import Catchup, Mode, Option, Overlap
from mpsched._core.recurring import ScheduleKind, ScheduleSpec, cron_slots, run_id, zone

MAX_COUNT = 100_000  # slots counted one by one (cron) before a count is reported as a floor


class Trigger(Option):
    """The moment :func:`plan` decides a schedule's next run at."""

    BEGIN = "begin"  # added, resumed, or recovered after downtime
    STARTED = "started"  # its run started (overlap allow)
    ENDED = "ended"  # its run ended (overlap skip and queue, mode delay)


class Slots:
    """The slot labels of one schedule (UTC epoch seconds, rounded to microseconds)."""

    def __init__(self, spec: ScheduleSpec, anchor: float, tz: str) -> None:
        """``anchor``: the first slot of an every-schedule; ``tz``: the resolved cron zone."""
        self.spec = spec
        self.anchor = anchor
        self._tz = zone(tz) if spec.kind == ScheduleKind.CRON else timezone.utc

    def after(self, label: float | None) -> float:
        """The first slot strictly after ``label`` (None: the first slot of all)."""
        spec = self.spec
        if spec.kind == ScheduleKind.CRON:
            return cron_slots(spec.cron, self._tz, self.anchor if label is None else label)
        if label is None or label < self.anchor:
            return self.anchor
        if spec.mode == Mode.DELAY:
            return round(label + spec.interval, 6)
        k = math.floor((label - self.anchor) / spec.interval) + 1
        slot = round(self.anchor + k * spec.interval, 6)
        while slot <= label:  # float rounding at the boundary
            k += 1
            slot = round(self.anchor + k * spec.interval, 6)
        return slot

    def late(self, after: float | None, upto: float) -> tuple[int, float | None, float | None]:
        """Slots in (after, upto]: how many (a floor of MAX_COUNT for long cron spans),
        the first and the last."""
        first = self.after(after)
        if first > upto:
            return 0, None, None
        if self.spec.kind == ScheduleKind.EVERY and self.spec.mode == Mode.RATE:
            k_first = round((first - self.anchor) / self.spec.interval)
            k_last = math.floor((upto - self.anchor) / self.spec.interval + 1e-9)
            last = round(self.anchor + k_last * self.spec.interval, 6)
            if last > upto:
                k_last -= 1
                last = round(self.anchor + k_last * self.spec.interval, 6)
            return k_last - k_first + 1, first, last
        count, last = 1, first
        while count < MAX_COUNT and (slot := self.after(last)) <= upto:
            count, last = count + 1, slot
        return count, first, last

    def preview(self, after: float | None, n: int) -> list[float]:
        """The next ``n`` slots after ``after`` (a delay-mode schedule: as if each run took
        no time)."""
        labels: list[float] = []
        for _ in range(n):
            labels.append(self.after(labels[-1] if labels else after))
        return labels


def resolve_anchor(spec: ScheduleSpec, now_wall: float) -> float:
    """The first slot of an every-schedule received at ``now_wall`` (cron: ``now_wall``,
    the instant its slots are counted from)."""
    if spec.kind == ScheduleKind.CRON:
        return now_wall
    if spec.start_at is not None:
        return round(spec.start_at, 6)
    delay = spec.interval if spec.start_delay is None else spec.start_delay
    return round(now_wall + delay, 6)


def jitter_offset(schedule_id: str, label: float, jitter: float) -> float:
    """A delay in [0, jitter) that depends only on the schedule and the slot, so that a
    restarted manager plans the same instant."""
    if jitter <= 0:
        return 0.0
    digest = hashlib.blake2b(run_id(schedule_id, label).encode(), digest_size=8).digest()
    return jitter * int.from_bytes(digest, "big") / 2.0**64


class Plan(NamedTuple):
    """What to do at one trigger."""

    arm: float | None  # the slot whose run to submit now (None: none)
    decided: float | None  # every slot up to here is armed, skipped or missed
    owed_until: float | None = None  # catchup="all": late slots up to here still to run
    skipped: int = 0
    missed: int = 0
    cancel_armed: bool = False  # catchup="skip" at recovery: the late armed run is dropped


def plan(
    slots: Slots,
    decided: float | None,
    owed_until: float | None,
    now: float,
    trigger: Trigger,
    *,
    active: bool = False,
) -> Plan:
    """Decide the next run of a schedule at ``now`` (a label on its own timeline).

    ``active``: at BEGIN, a run of it is still pending or running (recovered from the
    store). Late slots are missed at BEGIN, skipped at ENDED under overlap skip.
    """
    spec = slots.spec
    if spec.mode == Mode.DELAY:
        return _delay_plan(slots, decided, now, trigger, active=active)
    if owed_until is not None and trigger != Trigger.BEGIN:
        owed = slots.after(decided)
        if owed <= owed_until:
            return Plan(
                arm=owed, decided=owed, owed_until=owed_until if owed < owed_until else None
            )
    count, first, last = slots.late(decided, now)
    if count == 0 or first is None or last is None:
        if trigger == Trigger.BEGIN and active:
            return Plan(arm=None, decided=decided)
        nxt = slots.after(max(now, decided) if decided is not None else now)
        return Plan(arm=nxt, decided=nxt)
    if trigger == Trigger.ENDED and spec.overlap == Overlap.SKIP:
        nxt = slots.after(now)
        return Plan(arm=nxt, decided=nxt, skipped=count)
    if trigger == Trigger.BEGIN and active:
        return _recovered_plan(slots, decided, now, count, last)
    if spec.catchup == Catchup.LATEST:
        return Plan(arm=last, decided=last, missed=count - 1)
    if spec.catchup == Catchup.ALL:
        return Plan(arm=first, decided=first, owed_until=last if first < last else None)
    nxt = slots.after(now)
    return Plan(arm=nxt, decided=nxt, missed=count)


def _delay_plan(
    slots: Slots, decided: float | None, now: float, trigger: Trigger, *, active: bool
) -> Plan:
    """:func:`plan` for ``mode="delay"``: the next run an interval after ``now``."""
    if trigger == Trigger.BEGIN and decided is None:
        start = slots.after(None)
        return Plan(arm=start, decided=start)
    if trigger == Trigger.BEGIN and active:
        return Plan(arm=None, decided=decided)
    nxt = round(now + slots.spec.interval, 6)
    return Plan(arm=nxt, decided=nxt)


def _recovered_plan(
    slots: Slots, decided: float | None, now: float, count: int, last: float
) -> Plan:
    """:func:`plan` at BEGIN for a schedule whose run is still pending or running, with
    ``count`` slots missed up to ``last``: the run armed before the downtime is late itself
    and stands for them."""
    if slots.spec.catchup == Catchup.LATEST:
        return Plan(arm=None, decided=last, missed=count)
    if slots.spec.catchup == Catchup.ALL:
        return Plan(arm=None, decided=decided, owed_until=last)
    nxt = slots.after(now)
    return Plan(arm=nxt, decided=nxt, missed=count + 1, cancel_armed=True)
