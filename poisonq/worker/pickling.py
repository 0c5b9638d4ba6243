"""How the crash guard pickles a transform for its helper: cloudpickle, but a code object
keeps its file (see :class:`CodeWithItsFile`). Its own module, imported when a helper is
started, since cloudpickle comes with the ``spark`` extra and ``import poisonq`` (the
Processor) must not need it."""

from __future__ import annotations

import io
import marshal
import types
from collections import ChainMap
from typing import Any, ClassVar

import cloudpickle


def dumps(value: Any) -> bytes:
    out = io.BytesIO()
    CodeWithItsFile(out).dump(value)
    return out.getvalue()


class CodeWithItsFile(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle's pickler, but a code object keeps its file. cloudpickle rebuilds a
    function's code with ``<dynamic-code>`` as its file, so a failure's traceback would
    show no source line, and its fingerprint (which names the file:
    :func:`poisonq.failures.fingerprint`) would differ from the same failure outside the
    guard. The helper runs the caller's own interpreter, so code goes through ``marshal``
    instead, which keeps the file, the line table and the nested code; in format 2, which
    writes no back-references: later formats choose them by reference counts, so the same
    transform would pickle to other bytes (and start another helper) once a call had kept
    one of its constants."""

    dispatch_table: ClassVar[ChainMap[type, Any]] = ChainMap(
        {types.CodeType: lambda code: (marshal.loads, (marshal.dumps(code, 2),))},
        cloudpickle.Pickler.dispatch_table,
    )
