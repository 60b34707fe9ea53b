"""Jobs and outcomes as bytes: how the client pickles a job and rebuilds a job's error.

The manager never unpickles either; only the submitting client and the worker do.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import cloudpickle

from mpsched._errors import InvalidJobError, JobError, JobPicklingError, RemoteTraceback
from mpsched._job import Outcome

# Names in a pickle that mean "look this up in the main module": the worker's main module
# is not the client's, so such pickles must be made by cloudpickle, by value.
_MAIN, _MP_MAIN = b"__main__", b"__mp_main__"


def fast_dumps(obj: Any) -> bytes | None:
    """Pickle ``obj`` with the C pickler when that gives what cloudpickle would: only
    importable things by reference. None when cloudpickle is needed (lambdas, closures,
    anything from ``__main__``, modules registered for pickling by value)."""
    if cloudpickle.list_registry_pickle_by_value():
        return None
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
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


def pickle_job(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               fn_bytes: bytes | None = None) -> bytes:
    """The job's payload: cloudpickled ``(fn, args, kwargs)``; with ``fn_bytes`` (the
    callable cloudpickled once for many jobs, as map() does) ``(fn_bytes, args, kwargs)``.

    Raises:
        InvalidJobError: ``fn`` is not callable.
        JobPicklingError: ``fn`` or the arguments cannot be pickled.
    """
    if not callable(fn):
        raise InvalidJobError(f"{fn!r} is not callable")
    job = (fn if fn_bytes is None else fn_bytes, args, kwargs)
    fast = fast_dumps(job)
    if fast is not None:
        return fast
    try:
        payload: bytes = cloudpickle.dumps(job)
    except Exception as exc:
        name = getattr(fn, "__qualname__", repr(fn))
        raise JobPicklingError(f"cannot pickle job {name}: {exc!r}") from exc
    return payload


def remote_exception(outcome: Outcome) -> BaseException:
    exc: Any
    try:
        exc = cloudpickle.loads(outcome.payload)
    except BaseException as load_error:
        last = outcome.traceback.strip().splitlines()[-1:] or ["?"]
        exc = JobError(f"job {outcome.job_id} raised {last[0]} "
                       f"(its exception could not be unpickled here: {load_error!r})")
    if not isinstance(exc, BaseException):
        exc = JobError(f"job {outcome.job_id} failed with a non-exception {exc!r}")
    if outcome.traceback:
        exc.__cause__ = RemoteTraceback(f'\n"""\n{outcome.traceback}"""')
    error: BaseException = exc
    return error
