"""A probe: what a job costs a manager on this machine, by mechanism, mpsched's included.

    python benchmarks/probe_run_window.py [--rate 1000] [--seconds 5] [--job-ms 1]
        [--sweep-ms 5] [--repeats 2] [--at-once] [--books-warm]

Section 11's trickle (jobs due evenly, ``--rate`` a second, ``--job-ms`` of CPU each, two
worker processes), or with ``--at-once`` its batch (``--rate`` x ``--seconds`` jobs all
due at one instant), run by mpsched and by two bare mechanisms written for this probe.
Each bare one is a few dozen lines of Python with none of mpsched's bookkeeping: no
journal, leases or futures, and no results sent to a client.

- **mpsched**: a ``Scheduler(workers=2)``, every job ``schedule(at=...)``; the window
  starts once every submit is in. Its client's CPU is printed too.
- **rpc**: a take as mpsched makes it today, bare. Each worker sends its report and asks
  for its next job over a socket; a manager thread per worker answers with the next job
  once it is due within 2 ms (``EARLY_HANDOFF``), and the worker sleeps until the job's
  due time itself. One manager wake-up per job.
- **window**: the shared-memory run window proposed for local workers
  (``docs/design/run-window.md``). The manager keeps the soonest jobs in a shared table;
  an idle worker claims the head itself, under a process-shared lock, when it is due, and
  writes its report into the table. It rings the manager (a byte on a pipe) only if no
  sweep is promised; while ends come in, the manager sweeps every ``--sweep-ms`` (takes
  the reports, refills the table) without being rung. Run twice: with a POSIX semaphore
  and with a ``fcntl`` record lock.
- **window, RunWindow**: the same, on mpsched's own window (``mpsched._core.run_window``
  over a ``mpsched._worker.window_file.WindowFile``, its ``flock``), each worker's reports
  in a shared row of its own that the manager reads under the window's lock as it sweeps.
  What the structure costs over the bare window.
- **window + books**: the same, with mpsched's books kept in the manager as its service
  keeps them (``Books``): the jobs that go in the window leased together, each end
  completed as a worker's report is, the client's mailbox emptied at each sweep. No
  client, no store.
  ``--books-warm`` times those books alone, warm, in one process, and exits.

Printed per mechanism: the manager's CPU per job (its process CPU clock), the workers'
CPU beyond the jobs' own, the manager's wake-ups per job, the lateness of the jobs' starts
and, with ``--at-once``, section 11's efficiency (the jobs' own CPU / 2 / the time from
their due instant to the last end). The bare figures bound what each mechanism can reach
here; they are not mpsched's.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import mmap
import multiprocessing as mp
import os
import pickle
import select
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import wait as wait_futures
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Lock
from pathlib import Path
from typing import Any, TypeAlias

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from benchmarks._common import percentiles, scheduler  # noqa: E402
from benchmarks._threads import process_cpu_seconds  # noqa: E402
from benchmarks.bench_cpu_trickle import lead  # noqa: E402
from benchmarks.jobs import burn, calibrate_burn, noop  # noqa: E402
from mpsched._core.clock import SystemClock  # noqa: E402
from mpsched._core.job import JobRequest, Outcome  # noqa: E402
from mpsched._core.queue import JobQueue  # noqa: E402
from mpsched._core.run_window import Entry, RunWindow, claim_next  # noqa: E402
from mpsched._manager.no_journal import NoJournal  # noqa: E402
from mpsched._manager.service import ManagerService  # noqa: E402
from mpsched._protocol.codec import report_to_wire  # noqa: E402
from mpsched._protocol.records import Report, WorkerHello  # noqa: E402
from mpsched._transport.sockets import describe_versions  # noqa: E402
from mpsched._worker.window_file import WindowFile  # noqa: E402

WORKERS = 2
EARLY = 0.002  # mpsched's EARLY_HANDOFF

# The window: a header (next free slot to fill, next slot to claim, the time (ns,
# monotonic) by which the manager sweeps anyway, 0: rung or idle) and SLOTS slots of
# (state, due, started, cpu): EMPTY -> READY (the manager) -> CLAIMED (a worker) -> DONE
# (that worker) -> EMPTY (the manager's sweep).
SLOTS = 64
EMPTY, READY, CLAIMED, DONE = 0, 1, 2, 3
_HEAD = struct.Struct("qqq")
_SLOT = struct.Struct("qddd")


class FileLock:
    """A ``fcntl`` record lock on a file: the kernel releases it when its holder dies, which
    a POSIX semaphore does not (the design page's "a worker killed mid-claim"). Each
    process opens the file itself (record locks belong to the process)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd = -1

    def __enter__(self) -> None:
        if self._fd < 0:  # first use in this process
            self._fd = os.open(self._path, os.O_RDWR)
        fcntl.lockf(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN)


WindowLock: TypeAlias = Lock | FileLock


def _slot_at(i: int) -> int:
    return _HEAD.size + (i % SLOTS) * _SLOT.size


class Result:
    def __init__(self, name: str, jobs: int, manager_cpu: float, workers_extra: float) -> None:
        self.name = name
        self.jobs = jobs
        self.manager_cpu = manager_cpu
        self.workers_extra = workers_extra
        self.wakes = 0  # -1: not counted
        self.late: list[float] = []
        self.client_cpu: float | None = None
        self.own = 0.0  # the jobs' own CPU seconds
        # Seconds from the first due time to the last job's end (0: not printed); with every
        # job due at once, the jobs' own CPU / WORKERS / span is section 11's efficiency.
        self.span = 0.0

    def line(self) -> str:
        late = percentiles(self.late)
        wakes = "n/a " if self.wakes < 0 else f"{self.wakes / self.jobs:.2f}"
        client = (
            "" if self.client_cpu is None else f" (client {self.client_cpu / self.jobs * 1e6:.1f})"
        )
        efficiency = f"; efficiency {self.own / WORKERS / self.span:.3f}" if self.span else ""
        return (
            f"{self.name:<18} manager {self.manager_cpu / self.jobs * 1e6:6.1f} µs/job{client}, "
            f"wake-ups {wakes}/job; workers beyond the jobs "
            f"{self.workers_extra / self.jobs * 1e6:6.1f} µs/job; lateness p50 "
            f"{late['p50'] * 1e3:.3f} ms, p99 {late['p99'] * 1e3:.3f} ms{efficiency}"
        )


class CpuClocks:
    """The CPU clocks of this process (the manager) and of the workers, from now on."""

    def __init__(self, workers: Sequence[BaseProcess]) -> None:
        self._pids = [os.getpid(), *(p.pid or 0 for p in workers)]
        self._start = [process_cpu_seconds(pid) or 0.0 for pid in self._pids]

    def spent(self) -> list[float]:
        """Seconds of CPU since then: the manager's, then each worker's."""
        return [
            (process_cpu_seconds(pid) or 0.0) - start
            for pid, start in zip(self._pids, self._start, strict=True)
        ]

    def close(self, result: Result, own: float, last_end: float, first_due: float) -> Result:
        """Fill in ``result``'s CPU figures: the jobs' ``own`` CPU, their ``last_end``."""
        manager, *workers = self.spent()
        result.manager_cpu, result.workers_extra = manager, sum(workers) - own
        result.own, result.span = own, last_end - first_due
        return result


def wait_for_sweep(ring: int, sweep_by: float, idle_timeout: float | None) -> None:
    """Until the time promised to the workers (``sweep_by``, monotonic seconds) while ends
    stream in, who do not ring meanwhile. Idle (0): until a ring (the next end) or, if
    the window needs refills, ``idle_timeout``."""
    timeout = max(0.0, sweep_by - time.monotonic()) if sweep_by else idle_timeout
    ready, _, _ = select.select([ring], [], [], timeout)
    if ready:
        os.read(ring, 4096)


# ---------------------------------------------------------------------------- window


def _window_worker(buf: mmap.mmap, lock: WindowLock, ring: int, loops: int, sweep: float) -> None:
    while True:
        with lock:
            fill, claim, sweep_by = _HEAD.unpack_from(buf, 0)
            if claim >= fill:
                state, due = EMPTY, 0.0
            else:
                state, due, _, _ = _SLOT.unpack_from(buf, _slot_at(claim))
            now = time.monotonic()
            if state == READY and due <= now:
                _SLOT.pack_into(buf, _slot_at(claim), CLAIMED, due, now, 0.0)
                _HEAD.pack_into(buf, 0, fill, claim + 1, sweep_by)
                mine = claim
            else:
                mine = -1
        if mine < 0:
            if due < 0:  # the end
                return
            # Sleep until the head is due (the probe fills the window in due order; the
            # design wakes sleepers on a new head with a futex, see the design page).
            time.sleep(max(0.0, min(due - now, 0.001)) if due else 0.0005)
            continue
        started = time.monotonic()
        _, cpu = burn(loops)
        with lock:
            _SLOT.pack_into(buf, _slot_at(mine), DONE, due, started, cpu)
            fill, claim, sweep_by = _HEAD.unpack_from(buf, 0)
            rung = sweep_by == 0
            if rung:  # the manager waits for a ring: ring once (the other need not)
                _HEAD.pack_into(buf, 0, fill, claim, time.monotonic_ns() + int(sweep * 1e9))
        if rung:
            os.write(ring, b"x")


def run_window(dues: list[float], loops: int, sweep: float, file_lock: bool = False) -> Result:
    buf = mmap.mmap(-1, _HEAD.size + SLOTS * _SLOT.size)
    with tempfile.NamedTemporaryFile(prefix="probe-window-") as locked:
        lock: WindowLock = FileLock(locked.name) if file_lock else mp.get_context("fork").Lock()
        result = _run_window(buf, lock, dues, loops, sweep)
    result.name = "window, fcntl lock" if file_lock else "window"
    return result


def _run_window(
    buf: mmap.mmap, lock: WindowLock, dues: list[float], loops: int, sweep: float
) -> Result:
    r, w = os.pipe()
    try:
        with forked(_window_worker, lambda _: (buf, lock, w, loops, sweep)) as workers:
            return _manage_window(buf, lock, r, workers, dues, sweep)
    finally:
        os.close(r)
        os.close(w)


@contextlib.contextmanager
def forked(
    target: Callable[..., None], args_of: Callable[[int], tuple[Any, ...]]
) -> Iterator[Sequence[BaseProcess]]:
    """WORKERS processes forked on ``target`` (worker n with ``args_of(n)``), stopped
    (joined, killed if need be) at the end."""
    ctx = mp.get_context("fork")
    workers = [ctx.Process(target=target, args=args_of(n)) for n in range(WORKERS)]
    for p in workers:
        p.start()
    try:
        yield workers
    finally:
        _stop(workers)


def _stop(workers: Sequence[BaseProcess]) -> None:
    for p in workers:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join()


def _manage_window(
    buf: mmap.mmap,
    lock: WindowLock,
    r: int,
    workers: Sequence[BaseProcess],
    dues: list[float],
    sweep: float,
) -> Result:
    clocks = CpuClocks(workers)
    pending = 0  # next job of dues to put in the window
    collected = 0
    swept = 0  # next slot to sweep
    own = 0.0
    last_end = 0.0
    result = Result("window", len(dues), 0.0, 0.0)
    while collected < len(dues):
        with lock:
            sweep_by = _HEAD.unpack_from(buf, 0)[2]
        wait_for_sweep(r, sweep_by / 1e9, sweep if pending < len(dues) else None)
        result.wakes += 1
        with lock:
            fill, claim, _ = _HEAD.unpack_from(buf, 0)
            ended = 0
            while swept < claim:
                state, due, started, cpu = _SLOT.unpack_from(buf, _slot_at(swept))
                if state != DONE:
                    break
                result.late.append(started - due)
                last_end = max(last_end, started + cpu)
                own += cpu
                _SLOT.pack_into(buf, _slot_at(swept), EMPTY, 0.0, 0.0, 0.0)
                swept += 1
                ended += 1
            collected += ended
            while pending < len(dues) and fill - swept < SLOTS:
                _SLOT.pack_into(buf, _slot_at(fill), READY, dues[pending], 0.0, 0.0)
                fill += 1
                pending += 1
            promise = time.monotonic_ns() + int(sweep * 1e9) if ended else 0
            _HEAD.pack_into(buf, 0, fill, claim, promise)
    with lock:  # the end: a head due "before" anything, that no one claims
        fill, claim, _ = _HEAD.unpack_from(buf, 0)
        _SLOT.pack_into(buf, _slot_at(fill), EMPTY, -1.0, 0.0, 0.0)
        _HEAD.pack_into(buf, 0, fill + 1, claim, 0)
    return clocks.close(result, own, last_end, min(dues))


# ---------------------------------------------------------------------------- RunWindow


REPORTS = 256  # reports a worker's row holds before the manager's sweep reads them
STOP_LOOK = 0.05  # seconds between two looks of an idle worker at the probe's stop


def ring_at(ring: int) -> None:
    os.write(ring, b"x")


def _runwindow_worker(
    rows: WindowFile, taker: int, reports: Any, stop: Any, ring: int, loops: int
) -> None:
    """A worker of the window built on mpsched's own rules (RunWindow over a WindowFile):
    it claims, runs, writes its report into its row of ``reports`` (a count, then
    (due, started, cpu) each) and rings only if no sweep is promised."""
    window = RunWindow(rows)
    clock = SystemClock()
    base = taker * (1 + 3 * REPORTS)
    while True:
        # Asleep on the window's futex until the first entry is due or one due sooner
        # comes in; a look at ``stop`` every STOP_LOOK.
        claim = claim_next(window, rows.lock, rows, clock, taker, STOP_LOOK, lambda: ring_at(ring))
        if claim is None:
            if stop.value:
                return
            continue
        started = time.monotonic()
        _, cpu = burn(loops)
        with rows.lock:
            count = int(reports[base])
            at = base + 1 + 3 * (count % REPORTS)
            reports[at : at + 3] = [float(claim.lease_id), started, cpu]
            reports[base] = count + 1
            rung = window.ring_locked(time.monotonic())
        if rung:
            ring_at(ring)


class BareBooks:
    """The bare window's books: a job is its due time, and an end is only counted."""

    name = "window, RunWindow"

    def __init__(self, dues: list[float]) -> None:
        self.dues = dues
        self._next = 0  # the next job to put in the window

    def next_entries(self, room: int) -> list[Entry]:
        """Up to ``room`` jobs for the window, in heap order."""
        count = min(room, len(self.dues) - self._next)
        first, self._next = self._next, self._next + count
        return [Entry(n + 1, self.dues[n], 2, n) for n in range(first, first + count)]

    def backlog(self) -> bool:
        return self._next < len(self.dues)

    def due_of(self, lease_id: int) -> float:
        return self.dues[lease_id - 1]

    def ended(self, ends: list[tuple[int, float]]) -> None:
        """(lease id, start) of each job that ended since the last sweep."""


class Books(BareBooks):
    """mpsched's books, in the manager's process as its service keeps them: every job is
    submitted to a JobQueue first; the jobs that go in the window are leased together
    (``HandOut.lease_ahead``, the window's span ahead); each end is completed as a
    worker's report is (``Endings.complete_all``: the lease, the journal that keeps ended
    jobs a day, the client's mailbox), and the mailbox is emptied at each sweep. No
    client, no store."""

    name = "window + books"

    def __init__(self, dues: list[float]) -> None:
        super().__init__(dues)
        self._queue = JobQueue()
        self._service = ManagerService(self._queue, journal=NoJournal(self._queue, result_ttl=DAY))
        self._service.mailboxes.open("client")
        python, cloudpickle_version = describe_versions()
        here = self._service.host
        token = self._service.workers.local_token
        self._service.hello(
            WorkerHello(WINDOW, os.getpid(), here, python, cloudpickle_version, False, token)
        )
        payload = pickle.dumps((burn, (1,), {}))
        for n, due in enumerate(dues):
            delay = max(0.0, due - time.monotonic())
            self._queue.submit(JobRequest(f"job-{n}", "client", payload, 2, delay, None))
        self._leases: dict[int, tuple[str, float]] = {}  # lease id -> job id, due

    def next_entries(self, room: int) -> list[Entry]:
        entries = []
        for assignment in self._queue.hand_out.lease_ahead(WINDOW, WINDOW_SPAN, room):
            lease, due = assignment.lease, assignment.due
            assert due is not None
            self._leases[lease.lease_id] = (lease.job_id, due)
            entries.append(Entry(lease.lease_id, due, 2, lease.lease_id))
        return entries

    def backlog(self) -> bool:
        return len(self._queue) > 0

    def due_of(self, lease_id: int) -> float:
        return self._leases[lease_id][1]

    def ended(self, ends: list[tuple[int, float]]) -> None:
        if not ends:
            return
        reports = []
        for lease_id, started in ends:
            job_id, _ = self._leases.pop(lease_id)
            outcome = Outcome(job_id, True, RESULT, "", started)
            reports.append(report_to_wire(Report(lease_id, outcome)))
        self._service.report(WINDOW, reports)
        self._service.mailboxes.collect("client", 0.0)


WINDOW = "window"  # the worker id the window's leases are held under
WINDOW_SPAN = 1.0  # seconds ahead a job may go in the window
DAY = 86_400.0  # the manager's default result_ttl: ended jobs are kept that long
RESULT = pickle.dumps((0.0, 0.0))  # a burn's result, as a worker pickles it


def books_warm(jobs: int = 20_000, batch: int = 5) -> tuple[float, float]:
    """The books' cost per job, warm, in this process alone: (µs to lease jobs for the
    window, µs to complete their ends), ``batch`` jobs a sweep."""
    books = Books([time.monotonic() - 1.0] * jobs)  # all due
    fill = ends = 0.0
    for _ in range(jobs // batch):
        start = time.perf_counter()
        entries = books.next_entries(batch)
        middle = time.perf_counter()
        books.ended([(entry.lease_id, middle) for entry in entries])
        fill, ends = fill + middle - start, ends + time.perf_counter() - middle
    return fill / jobs * 1e6, ends / jobs * 1e6


def run_runwindow(dues: list[float], loops: int, sweep: float, books: bool = False) -> Result:
    """The window on mpsched's own rules; with ``books``, the manager keeps mpsched's books."""
    with tempfile.TemporaryDirectory(prefix="probe-runwindow-") as directory:
        rows = WindowFile(os.path.join(directory, "window"), SLOTS, create=True)
        try:
            return _run_runwindow(rows, Books(dues) if books else BareBooks(dues), loops, sweep)
        finally:
            rows.close()


def _run_runwindow(rows: WindowFile, books: BareBooks, loops: int, sweep: float) -> Result:
    r, w = os.pipe()
    ctx = mp.get_context("fork")
    reports = ctx.RawArray("d", WORKERS * (1 + 3 * REPORTS))
    stop = ctx.RawValue("b", 0)
    try:
        with forked(_runwindow_worker, lambda n: (rows, n, reports, stop, w, loops)) as workers:
            try:
                return _manage_runwindow(rows, reports, r, workers, books, sweep)
            finally:
                stop.value = 1  # before the workers are joined
    finally:
        os.close(r)
        os.close(w)


def _manage_runwindow(
    rows: WindowFile,
    reports: Any,
    r: int,
    workers: Sequence[BaseProcess],
    books: BareBooks,
    sweep: float,
) -> Result:
    window = RunWindow(rows, sweep_period=sweep)
    jobs, first_due = len(books.dues), min(books.dues)
    clocks = CpuClocks(workers)
    read = [0] * WORKERS  # reports read from each worker's row
    own = 0.0
    last_end = 0.0
    result = Result(books.name, jobs, 0.0, 0.0)
    while sum(read) < jobs:
        with rows.lock:
            sweep_by = rows.head().sweep_by
        wait_for_sweep(r, sweep_by, sweep if books.backlog() else None)
        result.wakes += 1
        ends: list[tuple[int, float]] = []
        with rows.lock:  # reports are read under the same hold as the sweep
            for taker in range(WORKERS):
                base = taker * (1 + 3 * REPORTS)
                while read[taker] < int(reports[base]):
                    at = base + 1 + 3 * (read[taker] % REPORTS)
                    lease, started, cpu = reports[at : at + 3]
                    ends.append((int(lease), started))
                    result.late.append(started - books.due_of(int(lease)))
                    last_end = max(last_end, started + cpu)
                    own += cpu
                    read[taker] += 1
            window.sweep_locked(time.monotonic(), len(ends))
            generation = window.generation_locked()
            window.fill_locked(books.next_entries(window.room_locked()), backlog=books.backlog())
            moved = window.generation_locked() != generation
        if moved:
            rows.wake_all()
        books.ended(ends)  # after the lock: workers claim meanwhile
    return clocks.close(result, own, last_end, first_due)


# ---------------------------------------------------------------------------- rpc


def _rpc_worker(sock: socket.socket, loops: int) -> None:
    report: tuple[float, float, float] | None = None
    while True:
        data = pickle.dumps(report)
        sock.sendall(struct.pack("!I", len(data)) + data)
        size = struct.unpack("!I", _recv(sock, 4))[0]
        due = pickle.loads(_recv(sock, size))
        if due is None:
            return
        while (now := time.monotonic()) < due:
            time.sleep(due - now)
        started = time.monotonic()
        _, cpu = burn(loops)
        report = (due, started, cpu)


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


class _Heap:
    """The jobs' due times in order, and the condition takers wait on for the head."""

    def __init__(self, dues: list[float]) -> None:
        self.dues = dues
        self.next = 0
        self.cond = threading.Condition()
        self.reports: list[tuple[float, float, float]] = []

    def take(self) -> float | None:
        with self.cond:
            while True:
                if self.next >= len(self.dues):
                    return None
                due = self.dues[self.next]
                wait = due - EARLY - time.monotonic()
                if wait <= 0:
                    self.next += 1
                    self.cond.notify()  # the next head is someone else's to time
                    return due
                self.cond.wait(wait)


def _serve(sock: socket.socket, heap: _Heap, wakes: list[int]) -> None:
    while True:
        size = struct.unpack("!I", _recv(sock, 4))[0]
        report = pickle.loads(_recv(sock, size))
        with heap.cond:
            wakes[0] += 1  # two serving threads count here: under the lock
            if report is not None:
                heap.reports.append(report)
        due = heap.take()
        data = pickle.dumps(due)
        sock.sendall(struct.pack("!I", len(data)) + data)
        if due is None:
            return


def run_rpc(dues: list[float], loops: int) -> Result:
    ctx = mp.get_context("fork")
    pairs = [socket.socketpair() for _ in range(WORKERS)]
    workers = [ctx.Process(target=_rpc_worker, args=(b, loops)) for _, b in pairs]
    for p in workers:
        p.start()
    try:
        return _manage_rpc([a for a, _ in pairs], workers, dues)
    finally:
        _stop(workers)
        for a, b in pairs:
            a.close()
            b.close()


def _manage_rpc(
    socks: list[socket.socket], workers: Sequence[BaseProcess], dues: list[float]
) -> Result:
    heap = _Heap(dues)
    wakes = [0]
    clocks = CpuClocks(workers)
    threads = [threading.Thread(target=_serve, args=(a, heap, wakes)) for a in socks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result = Result("rpc", len(dues), 0.0, 0.0)
    result.wakes = wakes[0]
    result.late = [started - due for due, started, _ in heap.reports]
    own = sum(cpu for _, _, cpu in heap.reports)
    last_end = max(started + cpu for _, started, cpu in heap.reports)
    return clocks.close(result, own, last_end, min(dues))


# ---------------------------------------------------------------------------- mpsched


def run_mpsched(jobs: int, rate: int, loops: int, at_once: bool = False) -> Result:
    """mpsched itself on the same trickle, for scale: its manager's CPU per job in the due
    phase (the client's is printed after it), its workers' beyond the jobs."""
    with scheduler(workers=WORKERS) as s:
        wait_futures([s.submit(noop) for _ in range(20)])
        manager = s._manager_process.pid
        workers = [w.pid for w in s.stats().workers]
        first = time.time() + lead(jobs)
        ats = [first if at_once else first + i / rate for i in range(jobs)]
        futures = [s.schedule(burn, loops, at=at) for at in ats]
        s.stats()  # every submit is in: the due phase starts
        pids = [os.getpid(), manager, *workers]
        cpu0 = [process_cpu_seconds(pid) or 0.0 for pid in pids]
        wait_futures(futures)
        cpu = [(process_cpu_seconds(pid) or 0.0) - c for pid, c in zip(pids, cpu0, strict=True)]
    outcomes = [f.result() for f in futures]
    result = Result("mpsched", jobs, cpu[1], sum(cpu[2:]) - sum(c for _, c in outcomes))
    result.late = [start - at for (start, _), at in zip(outcomes, ats, strict=True)]
    result.wakes = -1  # not counted
    result.client_cpu = cpu[0]
    result.own = sum(c for _, c in outcomes)
    result.span = max(start + c for start, c in outcomes) - first
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, default=1_000, help="jobs a second")
    parser.add_argument("--seconds", type=float, default=5.0, help="the trickle's span")
    parser.add_argument("--job-ms", type=float, default=1.0, help="CPU per job")
    parser.add_argument("--sweep-ms", type=float, default=5.0, help="window: sweep period")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--at-once",
        action="store_true",
        help="every job due at the same instant (section 11's batch) instead of a trickle",
    )
    parser.add_argument(
        "--books-warm",
        action="store_true",
        help="only time the books of 'window + books' warm, in this process, and exit",
    )
    args = parser.parse_args(argv)
    if args.books_warm:
        fill, ends = books_warm()
        print(f"books, warm: {fill:.1f} µs a job to lease it, {ends:.1f} µs to complete its end")
        return 0
    loops = calibrate_burn(args.job_ms / 1000)
    jobs = int(args.rate * args.seconds)
    for _ in range(args.repeats):
        results = [run_mpsched(jobs, args.rate, loops, args.at_once)]
        for name in ("rpc", "window", "fcntl", "runwindow", "books"):
            start = time.monotonic() + 0.3
            dues = [start if args.at_once else start + i / args.rate for i in range(jobs)]
            if name == "rpc":
                result = run_rpc(dues, loops)
            elif name in ("runwindow", "books"):
                result = run_runwindow(dues, loops, args.sweep_ms / 1000, name == "books")
            else:
                result = run_window(dues, loops, args.sweep_ms / 1000, name == "fcntl")
            results.append(result)
        for result in results:
            if not args.at_once:
                result.span = 0.0  # a trickle's span is its schedule's: no efficiency
            print(result.line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
