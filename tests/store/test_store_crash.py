"""SQLiteStore across processes: a killed writer loses nothing it acknowledged, and the lock
file keeps a second manager out (and is released when its holder dies)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpsched._core.job import JobState
from mpsched._errors import StoreLockedError
from mpsched._store import lease_log as _store_leases
from mpsched._store.sqlite import SQLiteStore

ROUNDS = 30
WAIT = 30.0  # real seconds a child may take to start or end

REGION = 2048  # bytes of a lease log region in these tests (~50 leases): kills land while
# regions are left, flushed behind, written again, or the log grows

# The child: 3 threads submit batches of 1 to 7 jobs and lease every third job, and every
# sixth one again after a requeue (its first worker died), and finish the others they leased
# (done or failed; every fourth finish with an outcome too long to ride in the lease log);
# after each call returns it appends one line to an O_APPEND log ("S batch size",
# "L job_id attempt", "Q job_id", "F job_id state outcome-length").
CHILD = r"""
import itertools, os, sys, threading, time
from mpsched._store import lease_log as _store_leases
from mpsched._store.base import StoredJob
from mpsched._core.job import JobState
from mpsched._store.sqlite import SQLiteStore

path, log_path, prefix, durability, region = sys.argv[1:6]
_store_leases.LIMIT = int(region)
store = SQLiteStore(path, durability=durability)
seqs = itertools.count(store.recover().next_seq)
log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

def submit(thread):
    for n in itertools.count():
        batch = f"{prefix}-{thread}-{n}"
        size = 1 + n % 7
        ids = [f"{batch}.{i}" for i in range(size)]
        store.submit([StoredJob(i, "c", None, "f", i.encode() * 3, 2, time.time(), next(seqs),
                                None, 1, 0, time.time()) for i in ids])
        os.write(log, f"S {batch} {size}\n".encode())
        if n % 3 == 0:
            store.lease(ids[0], f"w{thread}", 1)
            os.write(log, f"L {ids[0]} 1\n".encode())
        if n % 6 == 0:
            store.requeue(ids[0], 1)
            os.write(log, f"Q {ids[0]}\n".encode())
            store.lease(ids[0], f"v{thread}", 2)
            os.write(log, f"L {ids[0]} 2\n".encode())
        elif n % 3 == 0:
            state = (JobState.DONE, JobState.FAILED)[n % 2]
            length = _store_leases.OUTCOME_IN_LOG + 1 if n % 4 == 3 else 100 + n % 50
            store.finish(ids[0], state, outcome(ids[0], length), time.time())
            os.write(log, f"F {ids[0]} {state.value} {length}\n".encode())

def outcome(job_id, length):
    return (job_id.encode() * (length // len(job_id) + 1))[:length]

for thread in range(3):
    threading.Thread(target=submit, args=(thread,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""

HOLDER = r"""
import sys
from mpsched._store.sqlite import SQLiteStore
store = SQLiteStore(sys.argv[1])
print("locked", flush=True)
sys.stdin.read()
store.close()
"""


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    """Child processes that are killed and reaped when the test ends."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait(WAIT)
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()


def spawn(children: list[subprocess.Popen[str]], script: str, *args: str) -> subprocess.Popen[str]:
    root = str(Path(__file__).parents[2])  # the checkout, for mpsched
    child = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": root},
    )
    children.append(child)
    return child


def acknowledged(log: Path) -> tuple[dict[str, int], dict[str, int], dict[str, tuple[str, int]]]:
    """Batches (id -> size), the jobs whose last logged call was a lease (job id ->
    attempt) and the finished jobs (job id -> (state, outcome length)) the child logged; a
    torn last line is ignored."""
    batches: dict[str, int] = {}
    leases: dict[str, int] = {}
    finished: dict[str, tuple[str, int]] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "S" and parts[2].isdigit():
            batches[parts[1]] = int(parts[2])
        elif len(parts) == 3 and parts[0] == "L" and parts[2] in ("1", "2"):
            leases[parts[1]] = int(parts[2])
        elif len(parts) == 2 and parts[0] == "Q":
            leases.pop(parts[1], None)  # requeued: pending, or leased again if logged
        elif len(parts) == 4 and parts[0] == "F" and parts[3].isdigit():
            leases.pop(parts[1], None)
            finished[parts[1]] = (parts[2], int(parts[3]))
    return batches, leases, finished


def outcome(job_id: str, length: int) -> bytes:
    """The outcome the child finishes a job with (as its ``outcome``)."""
    return (job_id.encode() * (length // len(job_id) + 1))[:length]


@pytest.mark.slow
def test_a_killed_writer_loses_nothing_it_acknowledged(
    tmp_path: Path, children: list[subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_store_leases, "LIMIT", REGION)  # the log is read as it was written
    path = tmp_path / "jobs.db"
    rng = random.Random(7)
    for round_ in range(ROUNDS):
        log = tmp_path / f"ack-{round_}.log"
        child = spawn(
            children,
            CHILD,
            str(path),
            str(log),
            f"r{round_}",
            ("sync", "process")[round_ % 2],
            str(REGION),
        )
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(rng.uniform(0.0, 0.25))  # the kill lands at a random instant
        assert child.poll() is None, "the child ended on its own"
        child.send_signal(signal.SIGKILL)
        child.wait(WAIT)
        check_round(path, log, f"r{round_}-")


def check_round(path: Path, log: Path, prefix: str) -> None:
    batches, leases, finished = acknowledged(log)
    with SQLiteStore(path) as store:
        recovery = store.recover()
        pending = {j.job_id: j for j in recovery.pending if j.job_id.startswith(prefix)}
        running = {r.job.job_id: r.job for r in recovery.running if r.job.job_id.startswith(prefix)}
        ended = {
            record.job_id: store.get(record.job_id)
            for state in (JobState.DONE, JobState.FAILED)
            for record in store.jobs(state, None)
            if record.job_id.startswith(prefix)
        }
    assert not pending.keys() & running.keys()
    assert not ended.keys() & (pending.keys() | running.keys())
    for job_id, (state, length) in finished.items():  # a finish acknowledged stays finished
        assert job_id in ended, (job_id, "pending" if job_id in pending else "running")
        record = ended[job_id]
        assert record is not None and record.state.value == state, (job_id, record)
        assert record.outcome == outcome(job_id, length), job_id
    for job_id, record in ended.items():  # finished by the child, acknowledged or not
        assert record is not None and _batch_number(job_id) % 6 == 3, job_id
        assert job_id.endswith(".0"), job_id
        if record.outcome is None:  # killed while a long outcome waited for its commit
            assert job_id not in finished, job_id
        else:
            assert record.outcome == outcome(job_id, len(record.outcome)), job_id
    stored = pending | running
    for job_id, job in stored.items():  # nothing half-written
        assert job.payload == job_id.encode() * 3
    present: dict[str, int] = {}
    for job_id in (*stored, *ended):
        batch = job_id.rsplit(".", 1)[0]
        present[batch] = present.get(batch, 0) + 1
    for batch, size in batches.items():  # nothing acknowledged is lost
        assert present.get(batch) == size, (batch, size, present.get(batch))
    for batch, count in present.items():  # a batch is there whole or not at all
        assert count == 1 + _batch_number(f"{batch}.0") % 7, batch
    for job_id, attempt in leases.items():  # the lease after a requeue, not the first
        if job_id in running:
            assert running[job_id].attempt == attempt, (job_id, attempt, running[job_id])
        elif job_id in ended:  # killed inside the finish that follows, before its line
            assert attempt == 1 and _batch_number(job_id) % 6 == 3, job_id
        else:  # killed inside the requeue that follows a first lease, before its line
            assert attempt == 1 and _batch_number(job_id) % 6 == 0, job_id
            assert pending[job_id].attempt == 1, (job_id, pending[job_id])


def _batch_number(job_id: str) -> int:
    """n of a job id "prefix-thread-n.i"."""
    return int(job_id.rsplit(".", 1)[0].rsplit("-", 1)[1])


@pytest.mark.slow
def test_another_process_holding_the_store_keeps_it_until_it_ends(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    path = tmp_path / "jobs.db"
    holder = spawn(children, HOLDER, str(path))
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    with pytest.raises(StoreLockedError) as refused:
        SQLiteStore(path)
    assert refused.value.pid == holder.pid
    assert str(path) in str(refused.value) and f"pid {holder.pid}" in str(refused.value)
    holder.communicate("", timeout=WAIT)  # stdin closed: it closes the store and exits
    assert holder.returncode == 0
    SQLiteStore(path).close()


@pytest.mark.slow
def test_a_killed_holder_releases_the_store(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    path = tmp_path / "jobs.db"
    holder = spawn(children, HOLDER, str(path))
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    holder.send_signal(signal.SIGKILL)
    holder.wait(WAIT)
    SQLiteStore(path).close()  # the lock died with it; the stale pid in the file is ignored
