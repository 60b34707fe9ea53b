"""Why a worker's loop ended: what ``serve()`` (mpsched._worker.loop) returns, and, for a
remote worker, why one joined session of it ended."""

from __future__ import annotations

from mpsched._core.options import Option


class LoopEnd(Option):
    """Why a worker stopped taking jobs."""

    STOPPED = "stopped"  # the manager stopped (its queue closed)
    DISMISSED = "dismissed"  # a remote worker the manager dismissed: its pool leaves
    LOST = "lost"  # the manager went away (refused, reset, end of file)
    DRAINED = "drained"  # told to drain (SIGTERM), or its manager stopped it
    RECYCLED = "recycled"  # max_tasks or max_memory reached: a new process takes over
    RETIRED = "retired"  # a remote worker the manager declared gone: it joins again
