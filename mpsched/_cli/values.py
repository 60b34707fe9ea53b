"""The types that read option values: counts, seconds, intervals, queue and limit names.

Each raises ``argparse.ArgumentTypeError`` saying what it wants, in the same words for
every option of its kind; argparse prints it as a one-line usage error.
"""

from __future__ import annotations

import argparse

from mpsched._core.job_checks import check_name, check_queues
from mpsched._core.limits import parse_limit
from mpsched._core.options import Option
from mpsched._core.recurring import interval_problem


def queues(text: str) -> tuple[str, ...] | None:
    """A comma-separated list of queue names, in order (None: every queue)."""
    try:
        return check_queues(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def queue_name(text: str) -> str:
    """A queue's name."""
    try:
        return check_name("queue", text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def limit_name(text: str) -> str:
    """A limit's name, as a job names it."""
    try:
        return check_name("limit", text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def limit(text: str) -> tuple[str, str]:
    """A limit as serve declares it, NAME=FORM: its name and its form."""
    name, sep, form = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"a limit is NAME=FORM (exports=2), not {text!r}")
    try:
        return name, str(parse_limit(name.strip(), form.strip()))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def count(text: str) -> int:
    """A whole number, 1 or more."""
    value = count_or_zero(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def count_or_zero(text: str) -> int:
    """A whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def seconds(text: str) -> float:
    """A finite number of seconds, more than 0."""
    return _seconds_from(text, 0.0, inclusive=False)


def seconds_or_zero(text: str) -> float:
    """A finite number of seconds, 0 or more."""
    return _seconds_from(text, 0.0, inclusive=True)


def interval(text: str) -> float:
    """``--every``: the rule ``every()`` holds an interval to, in its words."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    problem = interval_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem.replace(f"{value:g}", text))
    return value


def _seconds_from(text: str, least: float, *, inclusive: bool) -> float:
    """``text`` as seconds, finite and at least (or, not ``inclusive``, more than)
    ``least``; every option of seconds says what it wants in the same words."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value >= least if inclusive else value > least) or value == float("inf"):
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds {'>=' if inclusive else '>'} {least:g}, not {text}"
        )
    return value


def words(option: type[Option]) -> list[str]:
    """An option's words, as argparse's choices (shown in --help and its errors)."""
    return [str(member) for member in option]
