"""The pure core: the job model, its checks and its option enums (``job``, ``job_checks``,
``options``), the clock, the heap, leases, JobQueue and its parts (``intake``,
``hand_out``, ``room``, ``wall_offset``, ``prefetch``), recurring schedules
(``recurring``) and their planning (``planning``), retry policies and their back-off
(``retrying``), lateness histograms, and the rules of a run window (``run_window``: not
used yet, see docs/design/run-window.md).

No multiprocessing, no sockets, no files: ordering, leases and the leader/follower wait are
tested with threads and a fake clock. May import: ``mpsched._errors`` only.
"""
