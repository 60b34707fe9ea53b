"""Recurring jobs (mpsched._core.recurring and planning): slots, catch-up, overlap,
jitter, cron and DST, validation. Pure arithmetic on made-up instants: no clock, no
process."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim

from mpsched._core.options import Catchup, Mode, OnError, Overlap
from mpsched._core.planning import Slots, Trigger, jitter_offset, plan
from mpsched._core.recurring import ScheduleKind, ScheduleSpec, check_spec, run_id, schedule_of
from mpsched._errors import ConfigError, ExtraMissingError, InvalidJobError


def spec(**changes: Any) -> ScheduleSpec:
    base = ScheduleSpec(
        "s",
        ScheduleKind.EVERY,
        10.0,
        Mode.RATE,
        "",
        "",
        None,
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
    return base._replace(**changes)


def every(anchor: float = 1000.0, **changes: Any) -> Slots:
    return Slots(spec(**changes), anchor, "")


def cron(expr: str, tz: str, anchor: float = 0.0) -> Slots:
    return Slots(spec(kind="cron", interval=0.0, cron=expr, tz=tz), anchor, tz)


# ------------------------------------------------------------------ slots


def test_rate_slots_are_anchor_plus_k_intervals():
    slots = every()
    assert slots.after(None) == 1000.0
    assert slots.after(999.0) == 1000.0
    assert slots.after(1000.0) == 1010.0
    assert slots.after(1005.0) == 1010.0
    assert slots.late(1000.0, 1035.0) == (3, 1010.0, 1030.0)
    assert slots.late(1000.0, 1009.9) == (0, None, None)
    assert slots.late(None, 1000.0) == (1, 1000.0, 1000.0)


def test_rate_slots_do_not_drift_over_a_million_intervals():
    slots = every(anchor=1_700_000_000.123456, interval=0.1)
    k = 1_000_000
    label = slots.after(1_700_000_000.123456 + k * 0.1 - 0.05)
    assert label == pytest.approx(1_700_000_000.123456 + k * 0.1, abs=1e-6)
    count, first, last = slots.late(1_700_000_000.123456, 1_700_000_000.123456 + k * 0.1)
    assert first == pytest.approx(1_700_000_000.223456, abs=1e-6)
    assert count == k and last == pytest.approx(label, abs=1e-6)


def test_delay_slots_follow_the_previous_end():
    slots = every(mode="delay")
    assert slots.after(None) == 1000.0
    assert slots.after(1234.5) == 1244.5
    decision = plan(slots, 1000.0, None, 1003.0, Trigger.ENDED)
    assert (decision.arm, decision.skipped, decision.missed) == (1013.0, 0, 0)


def test_preview_lists_the_next_slots():
    assert every().preview(1000.0, 3) == [1010.0, 1020.0, 1030.0]
    assert every().preview(None, 2) == [1000.0, 1010.0]


# ------------------------------------------------------------------ plan


def test_a_new_schedule_arms_its_first_slot():
    decision = plan(every(), None, None, 995.0, Trigger.BEGIN)
    assert (decision.arm, decision.decided, decision.skipped, decision.missed) == (
        1000.0,
        1000.0,
        0,
        0,
    )


def test_a_run_that_ended_on_time_arms_the_next_slot():
    decision = plan(every(), 1000.0, None, 1000.5, Trigger.ENDED)
    assert (decision.arm, decision.skipped, decision.missed) == (1010.0, 0, 0)


def test_overlap_skip_counts_the_slots_a_long_run_covered():
    decision = plan(every(), 1000.0, None, 1025.0, Trigger.ENDED)  # ran from 1000 to 1025
    assert (decision.arm, decision.skipped, decision.missed) == (1030.0, 2, 0)


def test_overlap_queue_with_catchup_latest_runs_once_for_the_backlog():
    slots = every(overlap="queue")
    decision = plan(slots, 1000.0, None, 1035.0, Trigger.ENDED)
    assert (decision.arm, decision.skipped, decision.missed) == (1030.0, 0, 2)


def test_overlap_queue_with_catchup_all_runs_each_late_slot_in_turn():
    slots = every(overlap="queue", catchup="all")
    armed = []
    decided: float | None = 1000.0
    owed: float | None = None
    now = 1035.0
    for _ in range(4):
        decision = plan(slots, decided, owed, now, Trigger.ENDED)
        armed.append(decision.arm)
        assert decision.skipped == decision.missed == 0
        decided, owed = decision.decided, decision.owed_until
        now += 0.1  # each catch-up run is short
    assert armed == [1010.0, 1020.0, 1030.0, 1040.0]


def test_catchup_skip_runs_none_of_the_late_slots_but_counts_them():
    slots = every(overlap="queue", catchup="skip")
    decision = plan(slots, 1000.0, None, 1035.0, Trigger.ENDED)
    assert (decision.arm, decision.skipped, decision.missed) == (1040.0, 0, 3)


def test_overlap_allow_arms_the_next_slot_when_a_run_starts():
    slots = every(overlap="allow")
    assert plan(slots, 1000.0, None, 1000.001, Trigger.STARTED).arm == 1010.0
    decision = plan(slots, 1000.0, None, 1021.0, Trigger.STARTED)  # it started late: a backlog
    assert (decision.arm, decision.missed) == (1020.0, 1)


def test_a_start_in_the_past_is_caught_up_as_catchup_says():
    latest = plan(every(), None, None, 1045.0, Trigger.BEGIN)
    assert (latest.arm, latest.missed) == (1040.0, 4)
    skipped = plan(every(catchup="skip"), None, None, 1045.0, Trigger.BEGIN)
    assert (skipped.arm, skipped.missed) == (1050.0, 5)
    everything = plan(every(catchup="all"), None, None, 1045.0, Trigger.BEGIN)
    assert (everything.arm, everything.owed_until) == (1000.0, 1040.0)


@pytest.mark.parametrize(
    ("catchup", "expected"),
    [
        ("latest", (None, 1030.0, None, 3, False)),
        ("all", (None, 1000.0, 1030.0, 0, False)),
        ("skip", (1040.0, 1040.0, None, 4, True)),
    ],
    ids=["latest", "all", "skip"],
)
def test_downtime_with_an_armed_run_recovered(catchup: str, expected: tuple[object, ...]):
    # The run for 1000 was pending when the manager died; it comes back at 1035.
    decision = plan(every(catchup=catchup), 1000.0, None, 1035.0, Trigger.BEGIN, active=True)
    assert (
        decision.arm,
        decision.decided,
        decision.owed_until,
        decision.missed,
        decision.cancel_armed,
    ) == expected


def test_the_armed_run_recovered_on_time_changes_nothing():
    decision = plan(every(), 1010.0, None, 1005.0, Trigger.BEGIN, active=True)
    assert decision.arm is None and decision.decided == 1010.0


# ------------------------------------------------------------------ ids and jitter


def test_run_ids_name_the_schedule_and_the_planned_utc_time():
    label = datetime(2026, 12, 3, 2, 30, tzinfo=timezone.utc).timestamp()
    assert run_id("nightly", label) == "nightly@2026-12-03T02:30:00Z"
    assert run_id("tick", label + 0.1) == "tick@2026-12-03T02:30:00.100000Z"
    assert schedule_of("nightly@2026-12-03T02:30:00Z") == "nightly"
    assert schedule_of("0f3a9c") is None


def test_jitter_is_deterministic_per_slot_and_within_bounds():
    offsets = [jitter_offset("s", 1000.0 + k, 5.0) for k in range(200)]
    assert offsets == [jitter_offset("s", 1000.0 + k, 5.0) for k in range(200)]
    assert all(0 <= o < 5.0 for o in offsets)
    assert len(set(offsets)) == 200 and max(offsets) > 2.5 > min(offsets)
    assert jitter_offset("other", 1000.0, 5.0) != offsets[0]
    assert jitter_offset("s", 1000.0, 0.0) == 0.0


# ------------------------------------------------------------------ cron and DST

ZONES = ["Europe/Berlin", "America/New_York", "Australia/Sydney", "UTC"]
EXPRESSIONS = ["30 2 * * *", "*/15 * * * *", "0 * * * 1-5", "15 1,2,3 * * *"]


@pytest.mark.parametrize("tz", ZONES)
@pytest.mark.parametrize("expr", EXPRESSIONS)
def test_cron_slots_match_cronsim_across_both_dst_changes(expr: str, tz: str):
    zone = ZoneInfo(tz)
    for year, month in ((2026, 3), (2026, 10), (2026, 4)):  # spring and fall, both sides
        start = datetime(year, month, 1, tzinfo=zone)
        expected = []
        it = CronSim(expr, start)
        while (when := next(it)) < start + timedelta(days=30):
            expected.append(when.timestamp())
        slots = cron(expr, tz, start.timestamp())
        labels, label = [], start.timestamp()
        while (label := slots.after(label)) < (start + timedelta(days=30)).timestamp():
            labels.append(label)
        assert labels == expected
        assert len(set(labels)) == len(labels)  # never twice for one slot


def test_a_daily_0230_runs_once_on_both_dst_days_in_berlin():
    zone = ZoneInfo("Europe/Berlin")
    slots = cron("30 2 * * *", "Europe/Berlin")
    spring = slots.preview(datetime(2026, 3, 28, 12, tzinfo=zone).timestamp(), 2)
    assert [datetime.fromtimestamp(t, zone).strftime("%m-%d %H:%M") for t in spring] == [
        "03-29 03:00",
        "03-30 02:30",
    ]
    fall = slots.preview(datetime(2026, 10, 24, 12, tzinfo=zone).timestamp(), 2)
    assert [datetime.fromtimestamp(t, zone).strftime("%m-%d %H:%M") for t in fall] == [
        "10-25 02:30",
        "10-26 02:30",
    ]


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "changes",
    [
        {"mode": "fixed"},
        {"overlap": "never"},
        {"catchup": "none"},
        {"on_error": "stop"},
    ],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()),
)
def test_an_unknown_option_word_is_a_config_error(changes: dict[str, object]):
    with pytest.raises(ConfigError, match=next(iter(changes))):
        check_spec(spec(**changes))


@pytest.mark.parametrize(
    "changes",
    [
        {"interval": 0.0},
        {"interval": float("nan")},
        {"interval": float("inf")},
        {"jitter": -1.0},
        {"schedule_id": "a@b"},
        {"schedule_id": ""},
        {"schedule_id": "x" * 201},
        {"start_at": 1e20},
        {"kind": "yearly"},
        {"kind": "cron", "cron": "61 * * * *"},
        {"kind": "cron", "cron": "* * *"},
        {"kind": "cron", "cron": "0 2 * * *", "tz": "Mars/Olympus"},
    ],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()),
)
def test_a_bad_spec_is_an_invalid_job_error(changes: dict[str, object]):
    with pytest.raises(InvalidJobError):
        check_spec(spec(**changes))


def test_cron_without_cronsim_names_the_extra(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "cronsim", None)
    with pytest.raises(ExtraMissingError, match=r"mpsched\[cron\]") as info:
        check_spec(spec(kind="cron", cron="0 2 * * *"))
    assert isinstance(info.value, ImportError)


def test_the_local_zone_comes_from_tz_and_an_unknown_one_is_passed_over(
    monkeypatch: pytest.MonkeyPatch,
):
    from mpsched._core.recurring import local_zone_name

    monkeypatch.setenv("TZ", "America/New_York")
    assert local_zone_name() == "America/New_York"
    monkeypatch.setenv("TZ", "Nowhere/Atlantis")
    assert local_zone_name() != "Nowhere/Atlantis"
    ZoneInfo(local_zone_name())  # whatever it falls back to is a real zone
