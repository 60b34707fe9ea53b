"""The checks of what a job asks for: due time, priority, timeout, retries, key and names.

The client runs them at the call site and the queue again on what it is sent, so both
raise the same :class:`InvalidJobError` with the same words.
"""

from __future__ import annotations

import math
import re
import time
from datetime import datetime, timedelta

from mpsched._errors import InvalidJobError

MAX_KEY = 256  # characters in an idempotency key
# A queue's or a limit's name: 1 to 64 of these characters.
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_CHECKED_NAMES: set[str] = set()  # names found valid, so that each is matched once
_CHECKED_MAX = 4096

# The epoch seconds of 0001-01-01 and 9999-12-31 23:59:59 UTC: due times must fit a datetime.
MIN_EPOCH = -62135596800.0
MAX_EPOCH = 253402300799.0


def due_arguments(
    delay: float | timedelta | None, at: float | datetime | None
) -> tuple[float | None, float | None]:
    """Validate ``delay``/``at`` and return ``(delay_seconds, at_epoch)`` for a JobRequest.

    Negative delays become 0 (due now). Naive datetimes mean local time.

    Raises:
        InvalidJobError: both given, a wrong type, NaN, infinity or an overflowing value.
    """
    if delay is not None and at is not None:
        raise InvalidJobError("give delay or at, not both")
    if at is not None:
        if isinstance(at, datetime):
            try:
                epoch = at.timestamp()
            except (OverflowError, OSError, ValueError) as exc:
                raise InvalidJobError(f"at={at!r} is out of range: {exc}") from None
        else:
            epoch = _seconds("at", at)
        return None, epoch
    if delay is None:
        return 0.0, None
    if isinstance(delay, timedelta):
        seconds = _seconds("delay", delay.total_seconds())
    else:
        seconds = _seconds("delay", delay)
    return max(0.0, seconds), None


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidJobError(f"{name} must be a number of seconds, not {value!r}")
    try:
        seconds = float(value)
    except OverflowError:
        raise InvalidJobError(f"{name}={value!r} overflows a float") from None
    if not math.isfinite(seconds):
        raise InvalidJobError(f"{name} must be finite, not {value!r}")
    return seconds


def check_name(what: str, name: object) -> str:
    """Return ``name`` if it is a valid queue or limit name: 1 to 64 characters of
    letters, digits and ``_.:-``.

    Raises:
        InvalidJobError: anything else; ``what`` ("queue", "limit") says which it names.
    """
    if name in _CHECKED_NAMES:
        return name
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidJobError(
            f"{what} name must be 1 to 64 characters of letters, digits and _.:-, not {name!r}"
        )
    if len(_CHECKED_NAMES) < _CHECKED_MAX:
        _CHECKED_NAMES.add(name)
    return name


def check_queues(queues: object) -> tuple[str, ...] | None:
    """A worker's subscriptions as a tuple of queue names in order (None or empty: every
    queue). A string is a comma-separated list.

    Raises:
        InvalidJobError: a name that is not valid (:func:`check_name`), or a repeated one.
    """
    if queues is None:
        return None
    if isinstance(queues, str):
        queues = [name.strip() for name in queues.split(",")]
    if not isinstance(queues, (list, tuple)):
        raise InvalidJobError(f"queues must be a list of queue names, not {queues!r}")
    names = tuple(check_name("queue", name) for name in queues)
    if len(set(names)) != len(names):
        raise InvalidJobError(f"queues repeats a name: {', '.join(names)}")
    return names or None


def check_job(
    priority: int,
    delay: float | None,
    at: float | None,
    timeout: float | None = None,
    retries: int = 0,
    key: str | None = None,
) -> None:
    """Check what a client may get wrong in a job: the client runs it at the call site, the
    queue runs it again (:func:`check_request`).

    Args: as the fields of :class:`JobRequest` (``priority`` is a level).

    Raises:
        InvalidJobError: an unknown priority level, a timeout that is not a positive number,
            retries that is not an int >= 0, not exactly one of delay and at, a due time
            that is not finite or not representable as a datetime (year 1 to 9999), or a
            key that is not a non-empty string of at most MAX_KEY characters.
    """
    check_run(priority, timeout, retries)
    if (delay is None) == (at is None):
        raise InvalidJobError("give exactly one of delay and at")
    value = delay if delay is not None else at
    try:
        finite = isinstance(value, (int, float)) and math.isfinite(value)
    except OverflowError:  # an int beyond float range
        finite = False
    if not finite:
        raise InvalidJobError(f"due time must be a finite number of seconds, not {value!r}")
    if at is not None and not MIN_EPOCH <= at <= MAX_EPOCH:
        raise InvalidJobError(f"at={at!r} is not a time between the years 1 and 9999")
    if delay is not None and delay > MAX_EPOCH - time.time():
        raise InvalidJobError(f"delay={delay!r} s ends after the year 9999")
    if key is not None and (not isinstance(key, str) or not key or len(key) > MAX_KEY):
        raise InvalidJobError(
            f"key must be a non-empty string of at most {MAX_KEY} characters, not {key!r}"
        )


def check_run(priority: int, timeout: float | None, retries: int) -> None:
    """Check how a job is to be run, whenever it is due: every run of a schedule too.

    Raises:
        InvalidJobError: an unknown priority level, a timeout that is not a positive
            number, or retries that is not an int >= 0.
    """
    if priority not in (1, 2, 3):
        raise InvalidJobError(f"unknown priority level {priority!r}")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout < math.inf
    ):
        raise InvalidJobError(f"timeout must be a positive number, not {timeout!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise InvalidJobError(f"retries must be a non-negative int, not {retries!r}")
