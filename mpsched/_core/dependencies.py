"""Jobs that wait for others: a blocked set with a count of parents not ended, and an
index from each parent to its children.

A job with parents is not in the heap. It waits here until its last parent ends: each end
counts its children down, an event, never a poll. At zero the child is released, to enter
the heap at its own due time. A parent that fails or is cancelled fails its children at
once, unless they allow failure; their ends then count their own children down, and so on.

Pure bookkeeping, with no lock of its own: the manager's ``Workflows`` holds one around
every call (mpsched._manager.workflows).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from mpsched._core.job import After, Job, Outcome, OutcomeKind


@dataclass(eq=False, slots=True)
class Waiting:
    """A job that waits for its parents."""

    job: Job  # due: the instant it is due once released (its own time)
    remaining: int  # parents not ended yet
    allow_failure: bool
    results: frozenset[str] | None  # parents whose outcome its arguments take
    inputs: dict[str, Outcome] | None = None  # of those, the outcomes so far


@dataclass(frozen=True, slots=True)
class Released:
    """A child whose last parent ended: it may enter the heap."""

    job: Job
    inputs: dict[str, Outcome] | None  # the parents' outcomes its ResultOf take


@dataclass(frozen=True, slots=True)
class Failed:
    """A child that will never run: its parent ``parent_id`` ended as ``parent_outcome``
    (an error's name, or "cancelled")."""

    job: Job
    parent_id: str
    parent_outcome: str


def outcome_word(outcome: Outcome) -> str:
    """How a parent that did not succeed ended, as a DependencyFailedError names it."""
    if outcome.error_kind == OutcomeKind.CANCELLED:
        return "cancelled"
    if outcome.error_kind in ("", OutcomeKind.RAISED):
        last = outcome.traceback.strip().splitlines()[-1:] or ["it raised"]
        return last[0]
    return str(outcome.error_kind)


class DependencyGraph:
    """The jobs waiting for parents, and each parent's children."""

    def __init__(self) -> None:
        self._waiting: dict[str, Waiting] = {}
        # parent id -> ids of its children still waiting (a child cancelled or failed
        # through another parent is skipped when this parent ends)
        self._children: dict[str, list[str]] = {}
        self.levels: dict[int, int] = {1: 0, 2: 0, 3: 0}  # waiting jobs by priority level

    def __bool__(self) -> bool:
        """Whether any parent has children waiting."""
        return bool(self._children)

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._waiting

    def get(self, job_id: str) -> Waiting | None:
        return self._waiting.get(job_id)

    def __iter__(self) -> Iterator[Waiting]:
        return iter(list(self._waiting.values()))

    def add(
        self, job: Job, after: After, live: list[str], ended: dict[str, Outcome]
    ) -> Released | Failed | None:
        """Add a job whose parents ``live`` have not ended and ``ended`` have (with their
        outcomes). Returns what to do with it now: release it (no live parent), fail it
        (an ended parent failed, and it does not allow that), or None: it waits."""
        results = frozenset(after.results) if after.results else None
        inputs: dict[str, Outcome] | None = {} if results else None
        for parent_id, outcome in ended.items():
            if not outcome.ok and not after.allow_failure:
                return Failed(job, parent_id, outcome_word(outcome))
            if results is not None and parent_id in results:
                assert inputs is not None
                inputs[parent_id] = outcome
        if not live:
            return Released(job, inputs)
        self._waiting[job.job_id] = Waiting(job, len(live), after.allow_failure, results, inputs)
        self.levels[job.priority] += 1
        for parent_id in live:
            self._children.setdefault(parent_id, []).append(job.job_id)
        return None

    def wants_result(self, parent_id: str) -> bool:
        """Whether a child waiting for ``parent_id`` takes its result."""
        for child_id in self._children.get(parent_id, ()):
            waiting = self._waiting.get(child_id)
            if waiting is not None and waiting.results and parent_id in waiting.results:
                return True
        return False

    def ended(self, parent_id: str, outcome: Outcome) -> list[Released | Failed]:
        """A job ended: count its waiting children down. Returns those released and those
        failed (whose own ends the caller reports here in turn)."""
        children = self._children.pop(parent_id, None)
        if children is None:
            return []
        verdicts: list[Released | Failed] = []
        for child_id in children:
            waiting = self._waiting.get(child_id)
            if waiting is None:
                continue
            if not outcome.ok and not waiting.allow_failure:
                del self._waiting[child_id]
                self.levels[waiting.job.priority] -= 1
                verdicts.append(Failed(waiting.job, parent_id, outcome_word(outcome)))
                continue
            if waiting.results is not None and parent_id in waiting.results:
                assert waiting.inputs is not None
                waiting.inputs[parent_id] = outcome
            waiting.remaining -= 1
            if waiting.remaining == 0:
                del self._waiting[child_id]
                self.levels[waiting.job.priority] -= 1
                verdicts.append(Released(waiting.job, waiting.inputs))
        return verdicts

    def remove(self, job_id: str) -> Job | None:
        """Take a waiting job out (cancelled); its parents are left as they are."""
        waiting = self._waiting.pop(job_id, None)
        if waiting is None:
            return None
        self.levels[waiting.job.priority] -= 1
        return waiting.job

    def remaining(self, job_id: str) -> int:
        """How many parents a job still waits for (0: it does not wait)."""
        waiting = self._waiting.get(job_id)
        return 0 if waiting is None else waiting.remaining
