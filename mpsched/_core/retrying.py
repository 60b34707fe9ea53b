"""Retries of jobs that raise: the policy a client gives, the terms the manager keeps, the
back-off, and the decision after a failed attempt.

A :class:`RetryPolicy` is split at the call site. Its numbers, :class:`RetryTerms`, travel
with the job request and live in the manager and the store, which never unpickle user
objects. Its exception filter, ``on`` and ``never``, travels inside the job's payload as a
:class:`RetryFilter` around the callable: the worker holds the exception, so the worker
tests its type and tells the manager only a word, the outcome's kind. A job without a
policy carries neither, and its worker tests nothing more than before.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

from mpsched._errors import InvalidJobError

RETRY_LATER_BUDGET = 3  # times a job without a policy may raise RetryLater
# The outcome kinds of a failed attempt that may run again (OutcomeKind's values); a
# RetryLater's kind carries its delay: "retry-later:<seconds>".
RETRYABLE = "retryable"
RETRY_LATER = "retry-later"
RETRY_LATER_PREFIX = RETRY_LATER + ":"
# Between a final exception's traceback and the earlier attempts' lines, in the
# outcome's traceback text: the client turns the lines into the exception's notes.
NOTES_MARKER = "\n\x00earlier attempts\n"
MAX_ERROR_LINE = 200  # characters of an error's one line kept for listings
# The longest back-off or RetryLater delay, in seconds (~31 years): a due time past it
# would not fit the datetimes that listings show.
MAX_DELAY = 1e9


class RetryTerms(NamedTuple):
    """A policy's numbers: what the manager and the store keep of it."""

    max_retries: int
    backoff: float
    factor: float
    max_backoff: float
    jitter: float


@dataclass(frozen=True)
class RetryPolicy:
    """How a job that raises is run again.

    The n-th retry (n = 1, 2, ...) is due ``min(max_backoff, backoff * factor**(n-1))``
    seconds after the failed attempt ended, times a factor in ``[1 - jitter, 1 + jitter]``
    fixed by the job's id and the attempt. An exception is retried when it is an instance
    of a type in ``on`` and of none in ``never``. A worker's death under the job counts
    against the same ``max_retries`` and is retried at once.

    Raises:
        InvalidJobError: a negative or non-int ``max_retries``; a ``backoff`` or
            ``max_backoff`` that is negative, NaN or above 1e9 s; ``factor`` below 1 or
            not finite; ``jitter`` outside [0, 1];
            ``on`` or ``never`` holding something other than exception types.
    """

    max_retries: int = 3
    _: KW_ONLY
    backoff: float = 1.0
    factor: float = 2.0
    max_backoff: float = 600.0
    jitter: float = 0.1
    # One type or a tuple of them; kept as a tuple.
    on: type[BaseException] | tuple[type[BaseException], ...] = (Exception,)
    never: type[BaseException] | tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_retries, bool)
            or not isinstance(self.max_retries, int)
            or self.max_retries < 0
        ):
            raise InvalidJobError(
                f"max_retries must be a non-negative int, not {self.max_retries!r}"
            )
        for name in ("backoff", "max_backoff"):
            _delay(name, getattr(self, name))
        _number("factor", self.factor, 1.0)
        if _number("jitter", self.jitter, 0.0) > 1.0:
            raise InvalidJobError(f"jitter must be between 0 and 1, not {self.jitter!r}")
        object.__setattr__(self, "on", _exception_types("on", self.on))
        object.__setattr__(self, "never", _exception_types("never", self.never))

    def terms(self) -> RetryTerms:
        """The numbers of this policy, as the manager keeps them."""
        return RetryTerms(
            self.max_retries,
            float(self.backoff),
            float(self.factor),
            float(self.max_backoff),
            float(self.jitter),
        )

    def retries(self, exc: BaseException) -> bool:
        """Whether ``exc`` is of a kind this policy retries."""
        return isinstance(exc, self.on) and not isinstance(exc, self.never)


def _number(name: str, value: object, low: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidJobError(f"{name} must be a number, not {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < low:
        raise InvalidJobError(f"{name} must be a finite number >= {low:g}, not {value!r}")
    return number


def _delay(name: str, value: object) -> float:
    seconds = _number(name, value, 0.0)
    if seconds > MAX_DELAY:
        raise InvalidJobError(f"{name} must be at most {MAX_DELAY:g} seconds, not {value!r}")
    return seconds


def _exception_types(name: str, value: object) -> tuple[type[BaseException], ...]:
    types = (value,) if isinstance(value, type) else value
    if not isinstance(types, (tuple, list, set, frozenset)) or not all(
        isinstance(t, type) and issubclass(t, BaseException) for t in types
    ):
        raise InvalidJobError(f"{name} must be exception types, not {value!r}")
    return tuple(types)


class RetryLater(Exception):
    """Raised in a job: run it again after ``delay`` seconds (a float or a timedelta).

    It counts against the job's retry budget: its policy's ``max_retries``, or 3 for a job
    without a policy. ``reason`` shows where the error would (``JobInfo.error``).

    Raises:
        InvalidJobError: a delay that is not a number of seconds from 0 to 1e9.
    """

    def __init__(self, delay: float | timedelta, reason: str | None = None) -> None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        self.delay = _delay("delay", seconds)
        self.reason = reason
        super().__init__(self.delay, reason)

    def __str__(self) -> str:
        return self.reason if self.reason is not None else f"retry in {self.delay:g} s"


RetryLater.__module__ = "mpsched"  # its one line reads "mpsched.RetryLater: reason"


def coerce_retry(retry: int | RetryPolicy | None, retries: int) -> RetryPolicy | None:
    """The policy ``retry=`` asks for: ``retry=3`` is ``RetryPolicy(3)``.

    Raises:
        InvalidJobError: ``retry`` is of another type, or both ``retry`` and ``retries``
            are given.
    """
    if retry is None:
        return None
    if isinstance(retry, bool) or not isinstance(retry, (int, RetryPolicy)):
        raise InvalidJobError(f"retry must be None, an int or a RetryPolicy, not {retry!r}")
    if retries:
        raise InvalidJobError(
            "give retry= or retries=, not both: a policy's max_retries "
            "also counts the worker deaths that retries= counts"
        )
    return RetryPolicy(retry) if isinstance(retry, int) else retry


@dataclass(frozen=True)
class RetryFilter:
    """A job's callable with its policy's exception filter: what a worker runs and asks
    whether an exception may be retried."""

    fn: Callable[..., Any]
    policy: RetryPolicy

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)  # a worker calls ``fn`` itself (mpsched._worker.run)

    def kind(self, exc: BaseException) -> str:
        """The outcome kind of ``exc``: RETRYABLE, or "" for the job's own failure."""
        return RETRYABLE if self.policy.retries(exc) else ""


def retry_later_kind(exc: RetryLater) -> str:
    """The outcome kind of a RetryLater: its word and its delay."""
    return f"{RETRY_LATER_PREFIX}{exc.delay!r}"


def backoff(terms: RetryTerms, job_id: str, retry: int) -> float:
    """Seconds until the ``retry``-th retry (1, 2, ...) of ``job_id`` is due, jitter in.

    The jitter is a hash of the job's id and the retry's number, so the same retry gets
    the same delay whichever manager computes it, and whenever.
    """
    try:
        base = min(terms.max_backoff, terms.backoff * terms.factor ** (retry - 1))
    except OverflowError:
        base = terms.max_backoff
    digest = hashlib.blake2b(f"{job_id}\0{retry}".encode(), digest_size=8).digest()
    uniform = int.from_bytes(digest, "big") / 2.0**64  # in [0, 1)
    return base * (1.0 + terms.jitter * (2.0 * uniform - 1.0))


def retry_delay(
    job_id: str, attempt: int, terms: RetryTerms | None, error_kind: str
) -> float | None:
    """Seconds until a job runs again after its ``attempt``-th run failed with an outcome
    of ``error_kind``; None when it does not run again (not retryable, or budget spent)."""
    if error_kind == RETRYABLE:
        if terms is None or attempt > terms.max_retries:
            return None
        return backoff(terms, job_id, attempt)
    if error_kind.startswith(RETRY_LATER_PREFIX):
        budget = RETRY_LATER_BUDGET if terms is None else terms.max_retries
        if attempt > budget:
            return None
        return float(error_kind[len(RETRY_LATER_PREFIX) :])
    return None


def is_retry_kind(error_kind: str) -> bool:
    """Whether an outcome of this kind may be run again (a retry decision is needed)."""
    return error_kind == RETRYABLE or error_kind.startswith(RETRY_LATER_PREFIX)


def retry_cause(error_kind: str) -> str:
    """The metrics' cause of a retry after an outcome of this kind."""
    return "retry_later" if error_kind.startswith(RETRY_LATER_PREFIX) else "exception"


def error_line(traceback_text: str) -> str:
    """An error's one line: the last line of its formatted traceback, shortened."""
    lines = traceback_text.split(NOTES_MARKER, 1)[0].strip().splitlines()
    line = lines[-1].strip() if lines else "?"
    return line if len(line) <= MAX_ERROR_LINE else line[: MAX_ERROR_LINE - 3] + "..."


def attempt_note(attempt: int, line: str, wall: float | None = None) -> str:
    """One earlier attempt, as the final exception's notes list it."""
    when = datetime.fromtimestamp(time.time() if wall is None else wall, timezone.utc)
    return f"attempt {attempt} failed at {when.isoformat(timespec='milliseconds')}: {line}"


def with_notes(traceback_text: str, notes: list[str]) -> str:
    """A final outcome's traceback text with the earlier attempts' notes after it."""
    return traceback_text + NOTES_MARKER + "\n".join(notes) if notes else traceback_text


def add_notes(exc: BaseException, traceback_text: str) -> str:
    """Add the notes a traceback text carries to ``exc``; returns the traceback alone."""
    text, marker, notes = traceback_text.partition(NOTES_MARKER)
    if marker:
        kept = getattr(exc, "__notes__", None)
        if not isinstance(kept, list):
            kept = []
            try:
                exc.__notes__ = kept  # type: ignore[attr-defined]  # add_note (3.11+)
            except AttributeError:
                return text
        kept.extend(notes.splitlines())
    return text


class RetryState(NamedTuple):
    """What a store keeps of a job with a retry policy, beside its row: the policy's
    numbers, the last failed attempt's one line, and a note per failed attempt."""

    terms: RetryTerms | None  # None: a job without a policy that raised RetryLater
    error: str | None = None
    notes: list[str] | None = None

    def encode(self) -> str:
        """As a store keeps it: JSON."""
        policy = None if self.terms is None else list(self.terms)
        return json.dumps(
            {"policy": policy, "error": self.error, "notes": self.notes or []},
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, text: str) -> RetryState:
        """What :meth:`encode` wrote.

        Raises:
            ValueError: ``text`` is not such JSON.
        """
        fields = json.loads(text)
        terms = None
        if fields.get("policy") is not None:
            max_retries, *numbers = fields["policy"]
            terms = RetryTerms(int(max_retries), *map(float, numbers))
        return cls(terms, fields.get("error"), list(fields.get("notes") or []) or None)
