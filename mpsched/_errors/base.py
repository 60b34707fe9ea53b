"""The base of every error, and the errors of using mpsched wrongly or at the wrong time."""

from __future__ import annotations

import queue


class MpschedError(Exception):
    """Base class of every error mpsched raises."""


class ConfigError(MpschedError, ValueError):
    """An option of a Scheduler, a store, a schedule or a call has a value mpsched does not
    take: an unknown word (``durability="fast"``) or a number out of its range."""

    def __init__(self, option: str, value: object, expected: str) -> None:
        self.option = option  # the option's name, as the caller spelled it
        self.value = value
        self.expected = expected  # what it takes: "'sync' or 'process'", "a positive int"
        super().__init__(f"{option} must be {expected}, not {value!r}")

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, object, str]]:
        return (type(self), (self.option, self.value, self.expected))


class SchedulerShutdownError(MpschedError, RuntimeError):
    """The scheduler (or its manager) was shut down; it takes no more jobs."""


class WorkerDismissedError(SchedulerShutdownError):
    """The manager tells this remote worker that its pool leaves (``drain-workers``, or a
    manager stopping with ``--drain-workers-on-stop``): the pool finishes its running jobs
    and exits. A SchedulerShutdownError, on which a pool of an earlier version exits."""


class NothingToRunError(MpschedError, RuntimeError):
    """``Scheduler.run_forever()`` found no schedule and no job pending or running: it
    would wait for a signal with nothing to run meanwhile."""

    def __init__(self) -> None:
        super().__init__(
            "run_forever() has nothing to run: the manager holds no schedule and no job "
            "pending or running. Add a schedule first (every() or cron()); to wait only for "
            "jobs, leave the with block or call shutdown(wait=True)"
        )

    def __reduce__(self) -> tuple[type[NothingToRunError], tuple[()]]:
        return (type(self), ())


class QueueFullError(MpschedError, queue.Full):
    """A bounded queue stayed full for the whole submit timeout."""

    def __init__(self, max_pending: int, timeout: float | None, unit: str = "jobs") -> None:
        self.max_pending = max_pending  # the bound that was reached, in ``unit``
        self.timeout = timeout
        self.unit = unit  # "jobs" (max_pending) or "payload bytes" (max_pending_bytes)
        super().__init__(f"queue full: {max_pending} {unit} pending, no room within {timeout} s")

    def __reduce__(self) -> tuple[type[QueueFullError], tuple[int, float | None, str]]:
        return (type(self), (self.max_pending, self.timeout, self.unit))


class ExtraMissingError(MpschedError, ImportError):
    """A feature needs an optional dependency that is not installed; names the extra."""

    def __init__(self, feature: str, extra: str, module: str, where: str = "") -> None:
        """``where``: the process that lacks it, as "the manager (pid 42 on db1)"."""
        self.feature, self.extra, self.module, self.where = feature, extra, module, where
        missing, there = (f", missing in {where}", " there") if where else ("", "")
        super().__init__(
            f"{feature} need the optional dependency {module}{missing}: "
            f"pip install 'mpsched[{extra}]'{there}",
            name=module,
        )

    def missing_in(self, where: str) -> ExtraMissingError:
        """The same error, saying which process lacks the dependency."""
        return ExtraMissingError(self.feature, self.extra, self.module, where)

    def __reduce__(self) -> tuple[type[ExtraMissingError], tuple[str, str, str, str]]:
        return (type(self), (self.feature, self.extra, self.module, self.where))
