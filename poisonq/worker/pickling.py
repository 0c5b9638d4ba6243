"""How the crash guard pickles a transform for its helper: cloudpickle, but a code object
keeps its file, and a function is rebuilt without cloudpickle (see
:class:`CodeWithItsFile`). Its own module, imported when a helper is started, since
cloudpickle comes with the ``spark`` extra and ``import poisonq`` (the Processor) must not
need it."""

from __future__ import annotations

import io
import marshal
import types
from collections import ChainMap
from collections.abc import Callable
from typing import Any, ClassVar

import cloudpickle
from cloudpickle import cloudpickle as reducers

from poisonq.worker import rebuild

# cloudpickle's reconstructors of a function and the twins that replace them in the pickle.
_TWINS: dict[Callable[..., Any], Callable[..., Any]] = {
    reducers._make_function: rebuild.make_function,
    reducers._function_setstate: rebuild.function_setstate,
    reducers._make_cell: rebuild.make_cell,
    reducers._make_empty_cell: rebuild.make_cell,
    reducers.subimport: rebuild.subimport,
}


def dumps(value: Any) -> bytes:
    out = io.BytesIO()
    CodeWithItsFile(out).dump(value)
    return out.getvalue()


def _lean(reduced: Any) -> Any:
    """A reduction of cloudpickle's with its reconstructor (the first item) and its state
    setter (the sixth) replaced by their twins in :mod:`poisonq.worker.rebuild`."""
    if not isinstance(reduced, tuple):
        return reduced
    parts = list(reduced)
    parts[0] = _TWINS.get(parts[0], parts[0])
    if len(parts) > 5 and parts[5] is not None:
        parts[5] = _TWINS.get(parts[5], parts[5])
    return tuple(parts)


def _leanly(reduce: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: _lean(reduce(value))


class CodeWithItsFile(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle's pickler, but a code object keeps its file, and a function, its cells
    and the modules it refers to are rebuilt by :mod:`poisonq.worker.rebuild`, so the
    helper loads a transform without importing cloudpickle (whose imports would be in every
    fork).

    cloudpickle rebuilds a function's code with ``<dynamic-code>`` as its file, so a
    failure's traceback would show no source line, and its fingerprint (which names the
    file: :func:`poisonq.failures.fingerprint`) would differ from the same failure outside
    the guard. The helper runs the caller's own interpreter, so code goes through ``marshal``
    instead, which keeps the file, the line table and the nested code; in format 2, which
    writes no back-references: later formats choose them by reference counts, so the same
    transform would pickle to other bytes (and start another helper) once a call had kept
    one of its constants."""

    dispatch_table: ClassVar[ChainMap[type, Any]] = ChainMap(
        {
            types.CodeType: lambda code: (marshal.loads, (marshal.dumps(code, 2),)),
            types.CellType: _leanly(reducers._cell_reduce),
            types.ModuleType: _leanly(reducers._module_reduce),
        },
        cloudpickle.Pickler.dispatch_table,
    )

    def reducer_override(self, obj: Any) -> Any:
        return _lean(super().reducer_override(obj))
