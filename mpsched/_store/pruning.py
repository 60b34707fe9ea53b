"""The SQLite store's own prunes of finished jobs, run by its writer between batches.

They go a step at a time, each in its own transaction: a whole prune (a minute of jobs
finished a day ago, 60,000 at 1,000 jobs/s: ~0.18 s in benchmarks/bench_store_steps.py)
would hold every submit waiting for the writer that long, where a step takes ~1.4 ms.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable

log = logging.getLogger("mpsched.store")

PRUNE_STEP = 500  # rows
PRUNE_ROWS = "DELETE FROM jobs WHERE seq IN (SELECT seq FROM jobs WHERE finished_wall <= ? LIMIT ?)"


class Pruner:
    """Every ``interval`` seconds, a prune of the jobs finished ``result_ttl`` ago, by steps.

    Used by the holder of the writer's lead only (its housekeeping), so it needs no lock.
    """

    def __init__(
        self, path: str, result_ttl: float, interval: float, clock: Callable[[], float]
    ) -> None:
        self._path = path
        self._result_ttl = result_ttl
        self._interval = interval
        self._clock = clock
        self._last = clock()  # when the last prune began
        self._cutoff: float | None = None  # while one goes on: what it deletes up to
        self._pruned = 0  # ... and the rows it deleted so far

    def step(self, conn: sqlite3.Connection) -> bool:
        """In the writer, between batches: every ``interval``, a prune of the jobs
        finished ``result_ttl`` ago, ``PRUNE_STEP`` rows per call (one transaction each), so
        that no batch waits for more than one step. True while the prune has steps left."""
        if self._cutoff is None:
            now = self._clock()
            if now - self._last < self._interval:
                return False
            self._last = now
            self._cutoff = now - self._result_ttl
            self._pruned = 0
        try:
            with conn:
                pruned = conn.execute(PRUNE_ROWS, (self._cutoff, PRUNE_STEP)).rowcount
        except sqlite3.Error as exc:
            log.warning("could not prune %s: %s", self._path, exc)
            self._cutoff = None
            return False
        self._pruned += pruned
        if pruned >= PRUNE_STEP:
            return True
        if self._pruned:
            log.info("pruned %d finished jobs from %s", self._pruned, self._path)
        self._cutoff = None
        return False
