"""The errors mpsched raises.

Every error derives from :class:`MpschedError` and, where one fits, from the standard
exception a caller would already catch for the same situation::

    MpschedError
     ├── InvalidJobError(ValueError)            bad due time, delay or priority at the call site
     │    └── PayloadTooLargeError               a job's pickle is larger than its store takes
     ├── ConfigError(ValueError)                an option mpsched does not take: an unknown
     │                                          word (durability, overlap, state) or a bound
     ├── AddressError(ValueError)               an address neither ``unix:PATH`` nor HOST:PORT
     ├── SchedulerShutdownError(RuntimeError)   submit after shutdown, manager gone
     │    └── WorkerDismissedError              (a remote worker's own: its pool drains, exits)
     ├── NothingToRunError(RuntimeError)        run_forever() with no schedule and no job
     ├── QueueFullError(queue.Full)             bounded queue had no room before the timeout
     ├── JobPicklingError(pickle.PicklingError) the callable or its arguments did not pickle
     ├── JobUnpicklingError(pickle.UnpicklingError)   ... or did not unpickle in the worker
     ├── ResultPicklingError(pickle.PicklingError)    the result did not pickle in the worker
     ├── ResultUnpicklingError(pickle.UnpicklingError) ... or did not unpickle in the client
     ├── JobError                               a job raised an exception that cannot travel
     │    └── DependencyFailedError             a job's parent failed or was cancelled
     ├── WorkerCrashedError(ChildProcessError)  the worker running a job died
     ├── JobTimeoutError(TimeoutError)          the job ran past its timeout and was killed
     ├── AuthenticationError(multiprocessing.AuthenticationError)   wrong or unsafe authkey
     │    ├── RuntimeDirError(PermissionError)  the local manager's directory is not this user's
     │    └── TlsError                          TLS set up wrongly, or its handshake failed
     ├── ManagerUnreachableError(ConnectionError)   no mpsched manager answers at an address
     │    ├── ManagerBusyError                  one does, but dropped every handshake tried
     │    └── ManagerConnectionLostError(SchedulerShutdownError)   a client lost its manager
     ├── JobNotFoundError(KeyError)             no job with that id (never, or forgotten)
     ├── ScheduleNotFoundError(KeyError)        no schedule with that id (or cancelled)
     ├── ExtraMissingError(ImportError)         a feature needs an optional extra not installed
     ├── VersionMismatchError                   peer runs another Python or cloudpickle
     ├── WorkerRetiredError                     (a remote worker's own: declared gone, join again)
     └── StoreError(OSError)                    the job store cannot be opened, read or written
          ├── StoreLockedError                  another manager holds the store's lock file
          ├── StoreFullError                    the disk or the database is full (SQLITE_FULL)
          └── StoreUnavailableError(ConnectionError)   a Redis store does not answer now
               └── StoreInDoubtError             ... nor whether it made the change asked

A job's own exception reaches ``Future.exception()`` as itself, with the worker's formatted
traceback chained as ``__cause__`` (a :class:`RemoteTraceback`).
"""

from __future__ import annotations

import errno
import multiprocessing
import pickle
import queue
import socket


class MpschedError(Exception):
    """Base class of every error mpsched raises."""


class InvalidJobError(MpschedError, ValueError):
    """A job was described wrongly: a NaN, infinite or overflowing time, an unknown priority."""


class PayloadTooLargeError(InvalidJobError):
    """A job's pickled callable and arguments are larger than its store can hold (a Redis
    string: 512 MiB, or the server's ``proto-max-bulk-len``)."""

    def __init__(self, size: int, limit: int, where: str) -> None:
        self.size = size
        self.limit = limit
        self.where = where
        super().__init__(
            f"the job's pickle is {size} bytes, more than {where} takes ({limit} bytes)"
        )

    def __reduce__(self) -> tuple[type[PayloadTooLargeError], tuple[int, int, str]]:
        return (type(self), (self.size, self.limit, self.where))


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


class JobPicklingError(MpschedError, pickle.PicklingError):
    """The callable or its arguments could not be pickled at the call site."""


class JobUnpicklingError(MpschedError, pickle.UnpicklingError):
    """The worker could not unpickle the job's callable or arguments."""


class ResultPicklingError(MpschedError, pickle.PicklingError):
    """The job ran, but the worker could not pickle its result."""


class ResultUnpicklingError(MpschedError, pickle.UnpicklingError):
    """The job ran, but the submitting client could not unpickle its result."""


class JobError(MpschedError):
    """A job raised an exception that could not be sent back as itself.

    The message names the original type and text; the remote traceback is the ``__cause__``.
    """


class DependencyFailedError(JobError):
    """A job ran after others (``after=``, ``ResultOf``), and one of them failed or was
    cancelled: the job never ran. ``parent_id`` names that parent, ``outcome`` how it
    ended (the name of its error, or "cancelled")."""

    def __init__(self, job_id: str, parent_id: str, outcome: str) -> None:
        self.job_id = job_id
        self.parent_id = parent_id
        self.outcome = outcome
        how = "was cancelled" if outcome == "cancelled" else "failed"
        if outcome not in ("cancelled", "failed", ""):
            how += f" ({outcome})"
        super().__init__(f"job {job_id} did not run: its parent job {parent_id} {how}")

    def __reduce__(self) -> tuple[type[DependencyFailedError], tuple[str, str, str]]:
        return (type(self), (self.job_id, self.parent_id, self.outcome))


class RemoteTraceback(Exception):
    """Carries the worker's formatted traceback; set as ``__cause__`` of a job's exception.

    ``traceback`` is the text as the worker formatted it; ``tb`` (and ``str()``) the same
    between triple quotes, as ``concurrent.futures`` shows a worker's traceback.
    """

    def __init__(self, traceback: str) -> None:
        self.traceback = traceback
        self.tb = f'\n"""\n{traceback}"""'
        super().__init__(traceback)

    def __str__(self) -> str:
        return self.tb


class WorkerCrashedError(MpschedError, ChildProcessError):
    """The worker process running a job died before reporting its outcome."""

    def __init__(self, job_id: str, worker_id: str, exitcode: int | None) -> None:
        self.job_id = job_id
        self.worker_id = worker_id
        self.exitcode = exitcode
        if exitcode is None:
            how = "went away"
        elif exitcode < 0:
            how = f"was killed by signal {_signal_name(-exitcode)}"
        else:
            how = f"exited with code {exitcode}"
        super().__init__(f"job {job_id}: worker {worker_id} {how} while running it")

    def __reduce__(self) -> tuple[type[WorkerCrashedError], tuple[str, str, int | None]]:
        return (type(self), (self.job_id, self.worker_id, self.exitcode))


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


class JobTimeoutError(MpschedError, TimeoutError):
    """A job ran longer than its ``timeout``; its worker's process tree was killed."""

    def __init__(self, job_id: str, timeout: float) -> None:
        self.job_id = job_id
        self.timeout = timeout
        super().__init__(f"job {job_id} ran past its timeout of {timeout:g} s and was killed")

    def __reduce__(self) -> tuple[type[JobTimeoutError], tuple[str, float]]:
        return (type(self), (self.job_id, self.timeout))


class AuthenticationError(MpschedError, multiprocessing.AuthenticationError):
    """The manager and this process do not share the authkey, or the key is unsafe."""


class TlsError(AuthenticationError):
    """TLS could not be set up: a certificate did not verify, a peer does not speak TLS or
    wants a client certificate, a certificate or key file does not load, or the key file
    is another user's or readable by others."""


class RuntimeDirError(AuthenticationError, PermissionError):
    """The local manager's runtime directory (its socket and key) is unsafe to use: not a
    directory, another user's, or open to others. ``path`` names it."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"refusing the runtime directory {path}: {problem}")

    def __reduce__(self) -> tuple[type[RuntimeDirError], tuple[str, str]]:
        return (type(self), (self.path, self.problem))


class AddressError(MpschedError, ValueError):
    """An address string that is neither ``unix:PATH`` nor ``HOST:PORT``."""


class ManagerUnreachableError(MpschedError, ConnectionError):
    """No mpsched manager answers at an address; ``reason`` says what is there instead.

    Build it with :meth:`from_error` from what connecting raised: an unknown host, nothing
    listening, something listening that is not an mpsched manager, or a manager that
    dropped every handshake the client tried (a ManagerBusyError), saying so.
    """

    _SAYS = "no manager answers at {address}: {reason}"

    def __init__(self, address: str, reason: str) -> None:
        self.address = address
        self.reason = reason
        super().__init__(self._SAYS.format(address=address, reason=reason))

    def __reduce__(self) -> tuple[type[ManagerUnreachableError], tuple[str, str]]:
        return (type(self), (self.address, self.reason))

    @classmethod
    def from_error(cls, address: str, exc: BaseException) -> ManagerUnreachableError:
        """Say what connecting to ``address`` (as the command line spells it) ran into.

        Failures to connect (name lookup, refused, no socket file, no route) say so; a
        manager that turned us away said why (``exc`` is then this error already);
        anything else that goes wrong once connected (silence until the handshake
        deadline, a hang-up, bytes that are not a challenge) means the peer is not an
        mpsched manager.
        """
        if isinstance(exc, ManagerBusyError):
            return ManagerBusyError(address, exc.reason)
        if isinstance(exc, ManagerUnreachableError):
            return cls(address, exc.reason)
        if isinstance(exc, socket.gaierror):
            host = address.rpartition(":")[0]
            return cls(address, f"unknown host {host} ({exc.strerror})")
        if isinstance(exc, (ConnectionRefusedError, FileNotFoundError)):
            what = "no such socket file" if isinstance(exc, FileNotFoundError) else exc.strerror
            return cls(address, f"nothing is listening there ({what})")
        if isinstance(exc, PermissionError):
            return cls(address, f"no permission to connect ({exc.strerror})")
        if isinstance(exc, OSError) and exc.errno in _NO_ROUTE:
            return cls(address, f"cannot reach the host ({exc.strerror})")
        # A manager serving TLS stays silent until the client speaks TLS, then hangs up at
        # its handshake deadline: the transport says so when the client had no TLS.
        tls = "; if it serves TLS, connect with --tls-ca" if "TLS" in str(exc) else ""
        if isinstance(exc, (BlockingIOError, TimeoutError)):
            how = f"it sent no handshake in time{tls}"
        elif isinstance(exc, (EOFError, ConnectionError)):
            how = f"it hung up during the handshake{tls}"
        else:
            how = f"it sent something else: {exc}"
        return cls(address, f"what listens there is not an mpsched manager ({how})")


class ManagerBusyError(ManagerUnreachableError):
    """A manager answers at an address, but closed each connection the client opened during
    its handshake, for as long as the client kept trying: it made room for newer
    connections (a flood of idle ones from the client's address, say), or it was stopping.
    ``reason`` says what happened last. Trying again later may succeed."""

    _SAYS = "the manager at {address} is busy: {reason}; try again later"


class ManagerConnectionLostError(ManagerUnreachableError, SchedulerShutdownError):
    """A client lost the connection to its manager at ``address`` (it died, stopped, or
    the network failed): ``reason`` says how, ``advice`` what became of the job or call and
    what to do. Also a SchedulerShutdownError, which clients raised for this before.

    A client of ``mpsched.connect()`` reconnects by itself; until it has, its submits
    raise this at once. A Scheduler's manager is not restarted: its client stays closed.
    """

    def __init__(self, address: str, reason: str, advice: str = "") -> None:
        self.address = address
        self.reason = reason
        self.advice = advice
        ConnectionError.__init__(
            self,
            f"lost the connection to the manager at {address} "
            f"({reason})" + (f"; {advice}" if advice else ""),
        )

    def __reduce__(  # type: ignore[override]
        self,
    ) -> tuple[
        type[ManagerConnectionLostError],
        tuple[str, str, str],
    ]:
        return (type(self), (self.address, self.reason, self.advice))


# connect() failures that mean the host itself cannot be reached
_NO_ROUTE = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EHOSTDOWN, errno.ETIMEDOUT})


class VersionMismatchError(MpschedError):
    """A worker or client runs another Python minor or cloudpickle version than its manager.

    Pickles of code are not portable across those, so the peer is refused.
    """

    def __init__(self, peer: str, mine: tuple[str, str], theirs: tuple[str, str]) -> None:
        self.peer = peer
        self.mine = mine
        self.theirs = theirs
        super().__init__(
            f"{peer} runs Python {theirs[0]} with cloudpickle {theirs[1]}, but the manager "
            f"runs Python {mine[0]} with cloudpickle {mine[1]}: use the same versions"
        )

    def __reduce__(
        self,
    ) -> tuple[type[VersionMismatchError], tuple[str, tuple[str, str], tuple[str, str]]]:
        return (type(self), (self.peer, self.mine, self.theirs))


class WorkerRetiredError(MpschedError):
    """The manager declared this worker gone (missed heartbeats); it must join again."""


class JobNotFoundError(MpschedError, KeyError):
    """The manager knows no job with this id: there never was one, or it ended and was
    forgotten (``result_ttl`` seconds later; without a store sooner when more than
    100,000 jobs ended since)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(job_id)

    def __str__(self) -> str:
        return (
            f"no job {self.job_id}: unknown, or ended and forgotten (ended jobs are "
            f"kept for result_ttl; without a store, at most the 100,000 latest)"
        )

    def __reduce__(self) -> tuple[type[JobNotFoundError], tuple[str]]:
        return (type(self), (self.job_id,))


class ScheduleNotFoundError(MpschedError, KeyError):
    """The manager has no schedule with this id: it was cancelled (``cancelled`` says the
    manager still remembers that, as it does for ``result_ttl``), or it never knew it."""

    def __init__(self, schedule_id: str, cancelled: bool = False) -> None:
        self.schedule_id = schedule_id
        self.cancelled = cancelled
        super().__init__(schedule_id)

    def __str__(self) -> str:
        if self.cancelled:
            return f"schedule {self.schedule_id!r} was cancelled"
        return f"no schedule {self.schedule_id!r}: never added, or cancelled and forgotten"

    def __reduce__(self) -> tuple[type[ScheduleNotFoundError], tuple[str, bool]]:
        return (type(self), (self.schedule_id, self.cancelled))


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


class StoreError(MpschedError, OSError):
    """The job store could not be opened, read or written. The message names its path.

    Raised at open (missing or read-only directory, a file that is not an mpsched store or
    comes from a newer mpsched) and by the one call whose change could not be written.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"job store {path}: {reason}")

    def __reduce__(self) -> tuple[type[StoreError], tuple[str, str]]:
        return (type(self), (self.path, self.reason))


class StoreLockedError(StoreError):
    """Another manager (process ``pid``, when known) has the store open: one manager per store."""

    def __init__(self, path: str, pid: int | None) -> None:
        self.pid = pid
        holder = "another manager" if pid is None else f"another manager (pid {pid})"
        super().__init__(
            path, f"in use by {holder}, which holds {path}.lock; stop it or use another store"
        )

    def __reduce__(self) -> tuple[type[StoreError], tuple[str, int | None]]:  # type: ignore[override]
        return (type(self), (self.path, self.pid))


class StoreFullError(StoreError):
    """The disk or the database was full: the changes of the failed batch were not written.

    Whatever was committed before stays; the store takes writes again once there is room.
    """

    def __init__(self, path: str) -> None:
        super().__init__(
            path, "the disk or the database is full (SQLITE_FULL): this change was not written"
        )

    def __reduce__(self) -> tuple[type[StoreError], tuple[str]]:  # type: ignore[override]
        return (type(self), (self.path,))


class StoreUnavailableError(StoreError, ConnectionError):
    """A Redis store did not answer (down, restarting, unreachable, or too slow): the call
    failed without waiting for it to come back. Nothing was changed, unless the error is a
    StoreInDoubtError. Managers retry with back-off by themselves."""

    def __reduce__(self) -> tuple[type[StoreError], tuple[str, str]]:
        return (type(self), (self.path, self.reason))


class StoreInDoubtError(StoreUnavailableError):
    """A Redis store took a change and gave no answer (it timed out, or the connection
    was lost on the way back), and did not answer again in time to tell whether it made
    it: a job submitted may be queued, and may run. Look it up by id (``Client.job``);
    a job submitted with ``key=`` may be submitted again safely."""
