"""``ResultOf``: a parent job's result standing in a child job's arguments.

The client finds them in a job's arguments (:func:`result_parents`) and sends their ids as
the job's parents. The manager never unpickles them: when the child is released, it puts
the parents' outcomes, as the bytes the workers reported, in front of the child's payload
(:func:`attach_inputs`). The worker takes them off (:func:`detach_inputs`), unpickles them
and puts each value where its ``ResultOf`` stands (:func:`substitute`).

``ResultOf`` is looked for at the top level of the arguments and one level inside a list,
tuple or dict argument: ``combine([ResultOf(f) for f in parts])``.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from mpsched._core.job import Outcome, Payload
from mpsched._errors import InvalidJobError

# The first bytes of a payload that carries its parents' outcomes in front of the job's own.
INPUTS_MAGIC = b"MPIN"
_LENGTH = 4  # bytes of the header's length, after the magic


class HasJobId(Protocol):
    """A job's future: its id is known at once (``JobFuture``)."""

    @property
    def id_nowait(self) -> str: ...


class ResultOf:
    """Stands for a parent job's result in a child job's arguments.

    ``s.schedule(report, ResultOf(f))`` runs ``report`` after ``f``'s job, with its result
    in place of the ``ResultOf``. It may stand at the top level of the positional or keyword
    arguments, or inside a list, tuple or dict argument. It implies ``after=[f]``. With
    ``allow_failure=True``, a failed parent's ``ResultOf`` is its exception.

    Args:
        job: the parent's ``JobFuture`` (of any client), or its job id.

    Raises:
        InvalidJobError: ``job`` is neither a future nor a non-empty string.
    """

    __slots__ = ("_job",)
    made = False  # set once any is made: a job's arguments are looked through from then

    def __init__(self, job: HasJobId | str) -> None:
        ResultOf.made = True
        if not isinstance(job, str) and not isinstance(getattr(job, "id_nowait", None), str):
            raise InvalidJobError(f"ResultOf takes a JobFuture or a job id, not {job!r}")
        if isinstance(job, str) and not job:
            raise InvalidJobError("ResultOf takes a non-empty job id")
        self._job = job

    @property
    def job_id(self) -> str:
        """The parent job's id."""
        job = self._job
        return job if isinstance(job, str) else job.id_nowait

    def __reduce__(self) -> tuple[type[ResultOf], tuple[str]]:
        return (ResultOf, (self.job_id,))

    def __repr__(self) -> str:
        return f"ResultOf({self.job_id!r})"


def made() -> bool:
    """Whether this process made a ResultOf yet (before that, no arguments hold one)."""
    return ResultOf.made


def result_parents(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[str]:
    """The ids of the jobs whose ``ResultOf`` stands in these arguments, in order, each once."""
    found: dict[str, None] = {}
    for value in (*args, *kwargs.values()):
        _visit(value, lambda r: found.setdefault(r.job_id))
    return list(found)


def _visit(value: Any, seen: Callable[[ResultOf], object]) -> None:
    kind = type(value)
    if kind is ResultOf:
        seen(value)
    elif kind in (list, tuple):
        for item in value:
            if type(item) is ResultOf:
                seen(item)
    elif kind is dict:
        for item in value.values():
            if type(item) is ResultOf:
                seen(item)


def substitute(
    args: tuple[Any, ...], kwargs: dict[str, Any], values: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` and ``kwargs`` with each ``ResultOf`` replaced by its job's value."""
    return (
        tuple(_replaced(a, values) for a in args),
        {k: _replaced(v, values) for k, v in kwargs.items()},
    )


def _replaced(value: Any, values: Mapping[str, Any]) -> Any:
    kind = type(value)
    if kind is ResultOf:
        return values[value.job_id]
    if kind is list or kind is tuple:
        if not any(type(item) is ResultOf for item in value):
            return value
        items = [values[i.job_id] if type(i) is ResultOf else i for i in value]
        return items if kind is list else tuple(items)
    if kind is dict:
        if not any(type(item) is ResultOf for item in value.values()):
            return value
        return {k: values[v.job_id] if type(v) is ResultOf else v for k, v in value.items()}
    return value


def attach_inputs(payload: Payload, outcomes: Mapping[str, Outcome]) -> bytes:
    """``payload`` with the parents' ``outcomes`` in front of it (plain data: the outcomes'
    bytes are not unpickled)."""
    header = pickle.dumps([tuple(o) for o in outcomes.values()], protocol=pickle.HIGHEST_PROTOCOL)
    return b"".join((INPUTS_MAGIC, len(header).to_bytes(_LENGTH, "big"), header, payload))


def detach_inputs(payload: Payload) -> tuple[dict[str, Outcome], Payload]:
    """The outcomes :func:`attach_inputs` put in front of a job's payload, and the payload;
    ({}, ``payload``) for a payload that carries none."""
    if payload[:4] != INPUTS_MAGIC:
        return {}, payload
    start = 4 + _LENGTH
    end = start + int.from_bytes(payload[4:start], "big")
    outcomes = [Outcome._make(o) for o in pickle.loads(payload[start:end])]
    return {o.job_id: o for o in outcomes}, payload[end:]


def job_payload(payload: Payload) -> Payload:
    """A job's own payload, without the outcomes a child's carries in front of it."""
    if payload[:4] != INPUTS_MAGIC:
        return payload
    start = 4 + _LENGTH
    return payload[start + int.from_bytes(payload[4:start], "big") :]
