"""Callables pickled by value: cloudpickle, with file names kept, and a cache for the plain
functions of the main script.

A function of the main script (or a lambda, a closure) travels by value: its code, its
attributes and the globals it reads. cloudpickle rebuilds all of that on every pickle,
some 20 us for a small function, which for a program submitting one function many times
is most of what a submit costs. Its pickle is a function of what it is made of, so it can
be reused as long as none of that can have changed; ``pickled_by_value`` keeps the pickle
of such a function only when everything it is made of is either immutable (numbers,
strings, bytes, None, and tuples and frozensets of those) or pickled by reference
(modules, and functions and classes of importable modules), so that checking identities
is enough to know nothing changed. A function whose pickle depends on anything mutable (a
list or dict it reads, a default that is one, an attribute set on it, a class or another
function of the main script) is pickled afresh every time, as before.
"""

from __future__ import annotations

import io
import pickle
import sys
import types
import weakref
from collections import ChainMap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import cloudpickle

_MAIN, _MP_MAIN = b"__main__", b"__mp_main__"


def by_value_modules() -> Any:
    """The modules registered with cloudpickle.register_pickle_by_value (cloudpickle's own
    set, read without the copy its public listing makes on every call)."""
    modules = getattr(cloudpickle.cloudpickle, "_PICKLE_BY_VALUE_MODULES", None)
    return cloudpickle.list_registry_pickle_by_value() if modules is None else modules


def cloudpickle_dumps(
    obj: Any, buffer_callback: Callable[[pickle.PickleBuffer], bool] | None = None
) -> bytes:
    """``cloudpickle.dumps`` (highest protocol), keeping the file name of the code it
    pickles by value: a worker's traceback through a function of the main script then
    names the script and its line, not ``<dynamic-code>``."""
    with io.BytesIO() as file:
        _Pickler(file, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=buffer_callback).dump(obj)
        return file.getvalue()


def _code_reduce(code: types.CodeType) -> tuple[Any, ...]:
    """cloudpickle's reduction of a code object, with its file name put back: cloudpickle
    writes ``<dynamic-code>`` there so that a payload does not depend on where its code
    was defined."""
    _, args = _CLOUDPICKLE_CODE_REDUCE(code)
    return _rebuild_code, (args, code.co_filename)


def _rebuild_code(args: tuple[Any, ...], filename: str) -> types.CodeType:
    return types.CodeType(*args).replace(co_filename=filename)


_CLOUDPICKLE_CODE_REDUCE = cloudpickle.Pickler.dispatch_table[types.CodeType]


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle has no types
    """cloudpickle's pickler with code objects that keep their file name."""

    dispatch_table: ClassVar[ChainMap[Any, Any]] = ChainMap(
        {types.CodeType: _code_reduce}, cloudpickle.Pickler.dispatch_table
    )


# ---------------------------------------------------------------------- the cache

_IMMUTABLE = frozenset((int, float, complex, bool, str, bytes, type(None), type(...)))
_MISSING = object()


@dataclass(frozen=True, eq=False)
class _Made:
    """What a function's pickle was made of, and the pickle."""

    pickled: bytes
    attributes: tuple[Any, ...]  # the function's own, in _attributes() order
    reads: tuple[tuple[str, Any], ...]  # the globals it names, with their values (or _MISSING)
    closure: tuple[Any, ...]  # its cells' contents
    modules: int  # len(sys.modules): its pickle names the submodules imported then
    by_value: int  # how many modules were registered to pickle by value


_made: weakref.WeakKeyDictionary[types.FunctionType, _Made] = weakref.WeakKeyDictionary()


def pickled_by_value(fn: Any) -> bytes | None:
    """The by-value pickle of ``fn``, a plain function of the main script, made once and
    reused while nothing it is made of can have changed; None for any other callable, or
    a function whose pickle depends on something mutable (pickle it as usual).

    Raises:
        Exception: whatever pickling ``fn`` raised.
    """
    if type(fn) is not types.FunctionType or fn.__module__ not in ("__main__", "__mp_main__"):
        return None
    made = _made.get(fn)
    if made is not None and _unchanged(fn, made):
        return made.pickled
    made = _make(fn)
    if made is None:
        return None
    _made[fn] = made
    return made.pickled


def _attributes(fn: types.FunctionType) -> tuple[Any, ...]:
    return (
        fn.__code__,
        fn.__defaults__,
        fn.__kwdefaults__,
        fn.__name__,
        fn.__qualname__,
        fn.__doc__,
        fn.__module__,
    )


def _unchanged(fn: types.FunctionType, made: _Made) -> bool:
    if (
        fn.__dict__
        or fn.__annotations__
        or len(sys.modules) != made.modules
        or len(by_value_modules()) != made.by_value
    ):
        return False
    if any(now is not then for now, then in zip(_attributes(fn), made.attributes, strict=True)):
        return False
    namespace = fn.__globals__
    if any(namespace.get(name, _MISSING) is not value for name, value in made.reads):
        return False
    cells = fn.__closure__ or ()
    return all(cell.cell_contents is value for cell, value in zip(cells, made.closure, strict=True))


def _make(fn: types.FunctionType) -> _Made | None:
    """Pickle ``fn`` and note what its pickle is made of; None when that includes
    anything mutable (its pickle is not kept)."""
    if fn.__dict__ or fn.__annotations__ or (fn.__kwdefaults__ is not None):
        return None
    # Names it reads that are not there yet count too: defined later, they would be in
    # its pickle.
    reads = tuple(
        (name, fn.__globals__.get(name, _MISSING))
        for name in dict.fromkeys(_global_names(fn.__code__))
    )
    try:
        closure = tuple(cell.cell_contents for cell in fn.__closure__ or ())
    except ValueError:  # a cell not filled yet
        return None
    values = [
        *(value for _, value in reads if value is not _MISSING),
        *closure,
        *(fn.__defaults__ or ()),
    ]
    if not all(_fixed(value, depth=3) for value in values):
        return None
    modules, by_value = len(sys.modules), len(by_value_modules())
    return _Made(cloudpickle_dumps(fn), _attributes(fn), reads, closure, modules, by_value)


def _global_names(code: types.CodeType) -> list[str]:
    """The global names ``code`` (and the code nested in it) reads or writes."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _global_names(const)
    return names


def _fixed(value: Any, depth: int) -> bool:
    """Whether ``value`` pickles the same for as long as it is the same object: immutable
    (within ``depth`` levels of tuples and frozensets), or pickled by reference."""
    kind = type(value)
    if kind in _IMMUTABLE:
        return True
    if kind is tuple or kind is frozenset:
        return depth > 0 and all(_fixed(item, depth - 1) for item in value)
    if kind is types.ModuleType:
        name = value.__name__
        return (
            sys.modules.get(name) is value
            and name not in ("__main__", "__mp_main__")
            and name not in by_value_modules()
        )
    if kind in (types.FunctionType, types.BuiltinFunctionType, type):
        return _by_reference(value)
    return False


def _by_reference(obj: Any) -> bool:
    """Whether the C pickler pickles ``obj`` (a function or class) by reference to an
    importable module, as cloudpickle then does."""
    if getattr(obj, "__module__", None) in ("__main__", "__mp_main__", None) or by_value_modules():
        return False
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return False
    return _MAIN not in data and _MP_MAIN not in data
