"""Jobs and outcomes as bytes: how the client pickles a job and rebuilds a job's error.

The manager never unpickles either; only the submitting client and the worker do.

Where the client shares the manager's shared memory (mpsched._payload.shm), a job is pickled with
protocol 5 and its large buffers (``bytes``, ``bytearray`` and contiguous ``memoryview``
arguments, NumPy arrays, anything that pickles through ``PickleBuffer``) go out of band
into one segment; the payload is then a frame naming it, followed by the small pickle.
A worker pickles a large result the same way. Whatever shared memory cannot take travels
inline, as before.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import cloudpickle

from mpsched._core.job import Outcome, Payload
from mpsched._core.retrying import NOTES_MARKER, add_notes
from mpsched._errors import InvalidJobError, JobError, JobPicklingError, RemoteTraceback
from mpsched._payload import frames, shm
from mpsched._payload.by_value import by_value_modules, cloudpickle_dumps, pickled_by_value
from mpsched._payload.segment_pool import SegmentPool, Stored, write_as

# Names in a pickle that mean "look this up in the main module": the worker's main module
# is not the client's, so such pickles must be made by cloudpickle, by value.
_MAIN, _MP_MAIN = b"__main__", b"__mp_main__"


def fast_dumps(
    obj: Any, buffer_callback: Callable[[pickle.PickleBuffer], bool] | None = None
) -> bytes | None:
    """Pickle ``obj`` with the C pickler when that gives what cloudpickle would: only
    importable things by reference. None when cloudpickle is needed (lambdas, closures,
    anything from ``__main__``, modules registered for pickling by value)."""
    if by_value_modules():
        return None
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=buffer_callback)
    except Exception:
        return None
    if _MAIN in data or _MP_MAIN in data:
        return None
    return data


def job_name(fn: Callable[..., Any]) -> str:
    """How listings name a job's callable: module:qualified name."""
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None)
    return f"{module}:{qualname}" if module else str(qualname)


def pickle_job(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    fn_bytes: bytes | None = None,
    pool: SegmentPool | None = None,
) -> bytes:
    """The job's payload: cloudpickled ``(fn, args, kwargs)``; with ``fn_bytes`` (the
    callable cloudpickled once for many jobs, as map() does) ``(fn_bytes, args, kwargs)``.

    With ``pool`` (this process shares the manager's shared memory) large buffers go out
    of band into a segment the pool gives, and the payload is framed
    (mpsched._payload.frames.frame). If shared memory cannot take them, the job is pickled inline
    instead: it never fails for want of shared memory.

    Raises:
        InvalidJobError: ``fn`` is not callable.
        JobPicklingError: ``fn`` or the arguments cannot be pickled.
    """
    if not callable(fn):
        raise InvalidJobError(f"{fn!r} is not callable")
    try:
        # A plain function of the main script is pickled once, while it stays the same.
        if fn_bytes is None:
            fn_bytes = pickled_by_value(fn)
        job = (fn if fn_bytes is None else fn_bytes, args, kwargs)
        # A callable of the main script always goes by value: no need to try the C pickler.
        fast = fn_bytes is not None or getattr(fn, "__module__", None) != "__main__"
        if pool is not None:
            framed = dumps_framed(job, pool.store, job=True, fast=fast)
            if framed is not None:
                return framed
        return dumps_carried(job, fast=fast)
    except Exception as exc:
        name = getattr(fn, "__qualname__", repr(fn))
        raise JobPicklingError(f"cannot pickle job {name}: {exc!r}") from exc


def _dumps(obj: Any, buffers: list[memoryview] | None = None, *, fast: bool = True) -> bytes:
    """Pickle with the C pickler when it gives what cloudpickle would (unless ``fast`` is
    False: the caller knows it does not), else cloudpickle. With ``buffers``, large
    out-of-band buffers are appended to it (not pickled)."""
    callback = None if buffers is None else partial(_out_of_band, buffers)
    pickled = fast_dumps(obj, callback) if fast else None
    if pickled is not None:
        return pickled
    if buffers is not None:
        buffers.clear()  # the C pickler's attempt may have met some before it gave up
    return cloudpickle_dumps(obj, callback)


def _out_of_band(buffers: list[memoryview], buffer: pickle.PickleBuffer) -> bool:
    """The pickler's buffer callback: keep large contiguous buffers (False: out of band)."""
    try:
        raw = buffer.raw()
    except BufferError:  # not contiguous: it stays in band
        return True
    if raw.nbytes < shm.THRESHOLD:
        return True
    buffers.append(raw)
    return False


def dumps_result(result: Any, segment: str = "") -> bytes:
    """A job's return value as an outcome payload: the C pickler where it can, else
    cloudpickle (lambdas, classes the job defined by value). With ``segment`` (a name
    under the manager's prefix), large buffers go out of band into that segment.

    Raises:
        Exception: whatever pickling raised.
    """
    if _plain(result):  # most results: nothing to look for, nothing by value
        return pickle.dumps(result, pickle.HIGHEST_PROTOCOL)
    if segment:
        framed = dumps_framed(result, partial(write_as, segment), job=False)
        if framed is not None:
            return framed
    return dumps_carried(result)


def dumps_framed(
    obj: Any, store: Callable[[list[memoryview]], Stored | None], *, job: bool, fast: bool = True
) -> bytes | None:
    """Pickle ``obj`` with its large buffers out of band, in the segment ``store`` writes
    them to. Returns the framed payload; a frame without a segment when there were no
    large buffers (only for a ``job``: a result is then plain); None when shared memory
    could not take them. ``fast``: as for :func:`_dumps`.

    Raises:
        Exception: whatever pickling raised.
    """
    buffers: list[memoryview] = []
    body = _dumps(_wrap(obj, [_MAX_VISITS], 0, {}), buffers, fast=fast)
    if not buffers:
        return frames.frame("", 0, (), body) if job else body
    stored = store(buffers)
    if stored is None:
        return None
    name, size, entries = stored
    return frames.frame(name, size, entries, body)


def dumps_carried(obj: Any, *, fast: bool = True) -> bytes:
    """Pickle ``obj`` for a trip without shared memory: a plain pickle, or, when it holds
    large buffers, a payload that carries them after its frame (mpsched._payload.frames.carry).
    ``fast``: as for :func:`_dumps`.

    Raises:
        Exception: whatever pickling raised.
    """
    buffers: list[memoryview] = []
    body = _dumps(_wrap(obj, [_MAX_VISITS], 0, {}), buffers, fast=fast)
    return frames.carry(buffers, body) if buffers else body


def loads(payload: Payload) -> Any:
    """Unpickle a job's or a result's payload, framed or not; out-of-band buffers are read
    from their segment (which stays: its owner unlinks it).

    Raises:
        Exception: whatever unpickling raised; OSError when the segment is gone.
    """
    parsed = frames.parse(payload)
    if parsed is None:
        return pickle.loads(payload)
    if parsed.segment:
        buffers: Iterable[Any] = shm.read(parsed.segment, parsed.entries)
    else:
        buffers = frames.inline_buffers(payload, parsed) if parsed.entries else ()
    return pickle.loads(memoryview(payload)[parsed.body :], buffers=buffers)


# How many items of nested tuples, lists and dicts _wrap looks at, and how deep: it finds
# large bytes among a job's arguments without costing much on a huge list of small ones.
_MAX_VISITS = 1000
_MAX_DEPTH = 4


class _Big:
    """A large ``bytes``, ``bytearray`` or ``memoryview`` that pickles out of band.

    The pickler hands exact ``bytes`` and ``bytearray`` to no hook (``reducer_override``
    is skipped for them), so they are swapped for this before pickling.
    """

    __slots__ = ("buffer",)

    def __init__(self, buffer: bytes | bytearray | memoryview) -> None:
        self.buffer = buffer

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, tuple[pickle.PickleBuffer]]:
        buffer = self.buffer
        if isinstance(buffer, memoryview):
            return memoryview, (pickle.PickleBuffer(buffer.cast("B")),)
        rebuild = bytes if type(buffer) is bytes else _own_bytearray
        return rebuild, (pickle.PickleBuffer(buffer),)


def _own_bytearray(buffer: Any) -> bytearray:
    """Rebuild a ``bytearray`` argument (one copy out of the mapped segment)."""
    return buffer if type(buffer) is bytearray else bytearray(buffer)


_CONTAINERS = frozenset((tuple, list, dict))
_BYTES = frozenset((bytes, bytearray))
# Values the C pickler writes by value whatever they hold, that never go out of band and
# never name a module: None, booleans, numbers and strings. A result that is one of them,
# or a short tuple of them, is pickled at once (no look for large buffers, no check for
# names in the main module).
_ATOMS = frozenset((type(None), bool, int, float, complex, str))
_PLAIN_TUPLE = 8


def _plain(obj: Any) -> bool:
    """Whether ``obj`` is an atom or a tuple of at most _PLAIN_TUPLE atoms."""
    kind = type(obj)
    if kind in _ATOMS:
        return True
    return kind is tuple and len(obj) <= _PLAIN_TUPLE and all(type(item) in _ATOMS for item in obj)


def _wrap(obj: Any, budget: list[int], depth: int, seen: dict[int, _Big]) -> Any:
    """``obj`` with its large bytes-like parts swapped for _Big (one per object, so an
    object passed twice is stored once); containers are copied only where something
    inside them was swapped."""
    kind = type(obj)
    if kind is bytes or kind is bytearray or kind is memoryview:
        big = (
            obj.nbytes >= shm.THRESHOLD and obj.c_contiguous
            if kind is memoryview
            else len(obj) >= shm.THRESHOLD
        )
        return seen.setdefault(id(obj), _Big(obj)) if big else obj
    if depth >= _MAX_DEPTH or kind not in _CONTAINERS:
        return obj
    budget[0] -= len(obj)
    if budget[0] < 0:
        return obj
    if kind is dict:
        if not any(map(_may_hold_big, obj.values())):
            return obj
        items = {k: _wrap(v, budget, depth + 1, seen) for k, v in obj.items()}
        changed = any(items[k] is not v for k, v in obj.items())
        return items if changed else obj
    for i, item in enumerate(obj):
        if not _may_hold_big(item):  # most arguments: one look, no call
            continue
        new = _wrap(item, budget, depth + 1, seen)
        if new is not item:  # copy this container, from here on wrapped
            parts = [*obj[:i], new, *(_wrap(x, budget, depth + 1, seen) for x in obj[i + 1 :])]
            return tuple(parts) if kind is tuple else parts
    return obj


def _may_hold_big(item: Any) -> bool:
    """Whether ``item`` is a large bytes-like object or a non-empty container: the one look
    most jobs' arguments (numbers, strings, small bytes) need."""
    kind = type(item)
    return (
        kind is memoryview
        or (kind in _BYTES and len(item) >= shm.THRESHOLD)
        or (kind in _CONTAINERS and bool(item))
    )


def remote_exception(outcome: Outcome) -> BaseException:
    exc: Any
    try:
        exc = cloudpickle.loads(outcome.payload)
    except BaseException as load_error:
        last = outcome.traceback.strip().splitlines()[-1:] or ["?"]
        exc = JobError(
            f"job {outcome.job_id} raised {last[0]} "
            f"(its exception could not be unpickled here: {load_error!r})"
        )
    if not isinstance(exc, BaseException):
        exc = JobError(f"job {outcome.job_id} failed with a non-exception {exc!r}")
    if outcome.traceback:
        text = outcome.traceback
        if NOTES_MARKER in text:  # a retried job's earlier attempts
            text = add_notes(exc, text)
        exc.__cause__ = RemoteTraceback(text)
    error: BaseException = exc
    return error
