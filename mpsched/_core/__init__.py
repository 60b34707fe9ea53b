"""The pure core: the job model, the clock, the heap, leases, JobQueue, recurring planning.

No multiprocessing, no sockets, no files: ordering, leases and the leader/follower wait are
tested with threads and a fake clock. May import: ``mpsched._errors`` only.
"""
