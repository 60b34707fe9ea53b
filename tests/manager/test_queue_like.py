"""JobQueue and SharedQueue both stand where the manager names JobQueueLike: mypy checks
the assignments here (a SharedQueue needs Redis, so only mypy sees that one)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpsched._core.queue import JobQueue
from mpsched._core.queue_like import JobQueueLike

if TYPE_CHECKING:
    from mpsched._manager.shared_queue import SharedQueue

    def shared_queue_is_job_queue_like(queue: SharedQueue) -> JobQueueLike:
        return queue


def test_a_job_queue_is_job_queue_like() -> None:
    queue: JobQueueLike = JobQueue()
    assert len(queue) == 0 and queue.head(1) == []
