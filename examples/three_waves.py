"""Three waves of jobs at mixed priorities, on processes: 4 producer processes, 3 workers,
12 jobs.

The design mpsched grew from (a heap, one lock and a timed wait, in threads) is
shown with 3 worker threads and 4 producer threads; producer ``p`` submits jobs
``p*10 + j`` (j = 0, 1, 2) due at ``now + (j+1)`` seconds with priority HIGH, MEDIUM, LOW by
``p % 3``. Here every one of those actors is a real process:

- ``Scheduler(workers=3)`` starts the manager process, which starts 3 worker processes.
- The 4 producers are ``spawn`` processes. A Scheduler cannot be pickled into them, so each
  one calls ``mpsched.connect(s.address, authkey=s.authkey)`` and submits its 3 jobs to the
  same manager itself, then waits for its own futures. It talks to this process over its
  own Pipe: its pid once connected, the origin time back, its ``ProducerReport`` at the end.
- Each job runs on a worker process: it stamps ``time.monotonic()`` (system-wide on Linux,
  so comparable with ours) when it starts, then works for 100 ms.

Before the waves, each worker runs one job: a fresh worker imports the job's module when
it unpickles its first job, which would make wave 1 start 10-20 ms late.

This process prints every job in the order the manager handed it out (due time, then
priority) with its start relative to its due time. Within a wave, two HIGH, one MEDIUM and
one LOW job are due at the same instant and 3 workers are free: the first three start
together, and the LOW job is the one left waiting until a worker finishes its 100 ms job.

The demo itself lives in ``mpsched/_cli/demo.py`` (spawned producers import their function
from there); this script only runs it.

Run it: ``python examples/three_waves.py``
"""

from __future__ import annotations

import sys

from mpsched._cli.demo import run_demo

if __name__ == "__main__":
    raise SystemExit(run_demo(sys.stdout))
