"""The closed sets of words mpsched's options take, as ``str`` enums.

A member is its word: ``durability="process"`` and ``durability=Durability.PROCESS`` are the
same option, compare equal, and print the same. :meth:`Option.coerce` turns what a caller
passed into the member, or raises :class:`~mpsched._errors.ConfigError` naming the option
and the words it takes.
"""

from __future__ import annotations

import enum
import re
from typing import Literal, TypeVar

from mpsched._errors import ConfigError

OptionT = TypeVar("OptionT", bound="Option")


class Option(str, enum.Enum):
    """A word one option takes (subclasses list them)."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def coerce(cls: type[OptionT], value: object, what: str | None = None) -> OptionT:
        """The member ``value`` names (a member or its word).

        Raises:
            ConfigError: ``value`` is not one of the words; ``what`` names the option
                (default: the class name, snake case).
        """
        try:
            return cls(value)
        except (ValueError, TypeError):
            name = what or re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()
            raise ConfigError(name, value, words(cls)) from None


def words(option: type[Option]) -> str:
    """``'a', 'b' or 'c'``: the words an option takes, for a message."""
    quoted = [repr(str(member.value)) for member in option]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


class Durability(Option):
    """What an acknowledged change in a SQLite store survives."""

    SYNC = "sync"  # a power cut (each submit or cancel is on disk before it returns)
    PROCESS = "process"  # a crash of the manager process, not of the machine


class Mode(Option):
    """How an every-schedule's slots are planned."""

    RATE = "rate"  # start + k * interval: no drift
    DELAY = "delay"  # interval after the previous run ended


class Overlap(Option):
    """What a schedule does with a slot that falls while its previous run is not over."""

    SKIP = "skip"  # skip it (counted)
    QUEUE = "queue"  # run it when the previous run ends
    ALLOW = "allow"  # run both at once


class Catchup(Option):
    """What a schedule does with slots it missed (manager down, backlog)."""

    LATEST = "latest"  # run the latest of them once
    ALL = "all"  # run each
    SKIP = "skip"  # run none


class OnError(Option):
    """What a schedule does when a run fails."""

    CONTINUE = "continue"  # nothing: the next slot runs
    PAUSE = "pause"  # pause the schedule


# What the API takes for each option: a member, or its word (a typo fails mypy).
DurabilityLike = Durability | Literal["sync", "process"]
ModeLike = Mode | Literal["rate", "delay"]
OverlapLike = Overlap | Literal["skip", "queue", "allow"]
CatchupLike = Catchup | Literal["latest", "all", "skip"]
OnErrorLike = OnError | Literal["continue", "pause"]
