"""Schedules of managers that share a Redis store, in this process against a real
redis-server: a schedule added on two managers has one timeline, so each slot is one
run id whichever manager arms it."""

from __future__ import annotations

import time
from collections.abc import Callable

from shared_peers import Peer

from mpsched._core.clock import SystemClock
from mpsched._core.options import Catchup, Mode, OnError, Overlap
from mpsched._core.recurring import ScheduleKind, ScheduleSpec
from mpsched._manager.schedules import Schedules


def every_ten_seconds() -> ScheduleSpec:
    return ScheduleSpec(
        "tick",
        ScheduleKind.EVERY,
        10.0,
        Mode.RATE,
        "",
        "",
        5.0,
        None,
        0.0,
        Overlap.SKIP,
        Catchup.LATEST,
        OnError.CONTINUE,
        2,
        None,
        0,
        "m:f",
        b"payload",
    )


def test_one_schedule_added_on_two_managers_that_heard_nothing_of_each_other_is_one(
    peers: Callable[..., Peer],
) -> None:
    # Neither manager hears the other's add (no subscriber passes it on): the store
    # alone makes the second take the first one's timeline.
    first, second = peers("m1"), peers("m2")
    planners = [
        Schedules(peer.journal, SystemClock(), lambda jobs: None) for peer in (first, second)
    ]
    planners[0].add(every_ten_seconds())
    time.sleep(0.01)  # the second is sent later: its own first slot would be later too
    planners[1].add(every_ten_seconds())
    armed = [job.job_id for job in first.store.jobs() if job.job_id.startswith("tick@")]
    assert len(armed) == 1, armed  # both armed the same slot: one run
    assert planners[0].preview("tick", 3) == planners[1].preview("tick", 3)
    for planner in planners:
        planner.close()
