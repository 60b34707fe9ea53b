"""What every() and cron() are asked, checked into a spec at the call site
(mpsched._client.recurring.build_spec): starts and default ids."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from mpsched._client.recurring import ScheduleRequest, build_spec, default_id
from mpsched._core.recurring import ScheduleKind, ScheduleSpec
from mpsched._errors import InvalidJobError


def _noop() -> None:
    pass


def test_start_takes_a_delay_a_timedelta_epoch_seconds_or_a_datetime():
    def built(start: object) -> ScheduleSpec:
        return build_spec(
            ScheduleRequest(kind=ScheduleKind.EVERY, schedule_id="s", interval=10, start=start),  # type: ignore[arg-type]
            _noop,
            (),
            {},
        )

    assert (built(5).start_delay, built(5).start_at) == (5.0, None)
    assert built(timedelta(minutes=1)).start_delay == 60.0
    assert built(1.8e9).start_at == 1.8e9
    when = datetime(2027, 1, 1, tzinfo=timezone.utc)
    assert built(when).start_at == when.timestamp()
    with pytest.raises(InvalidJobError):
        built("soon")


def test_the_default_id_is_stable_for_one_spec_and_differs_for_another():
    def built(interval: float, *args: object) -> ScheduleSpec:
        return build_spec(
            ScheduleRequest(kind=ScheduleKind.EVERY, interval=interval), _noop, args, {}
        )

    assert built(10).schedule_id == built(10).schedule_id == default_id(built(10))
    assert built(10).schedule_id.startswith("_noop~")
    assert built(10).schedule_id != built(20).schedule_id
    assert built(10, 1).schedule_id != built(10, 2).schedule_id
