"""The functions that rebuild a transform pickled by value, in the crash guard's helper.

cloudpickle's own (``cloudpickle.cloudpickle._make_function`` and its kind) live in a module
that imports ``logging``, ``threading``, ``uuid`` and ``platform``; the helper unpickling
them would load all of that, and ``threading`` and ``logging`` register fork handlers that run
Python code in every child the helper forks, so that each crash would pay for them
(docs/speed.md, the crash guard). These do the same work with the standard library alone;
:class:`poisonq.worker.pickling.CodeWithItsFile` writes them into the pickle in place of
cloudpickle's. What has no twin here (a class pickled by value) still names cloudpickle's,
and the helper imports cloudpickle to load it.
"""

from __future__ import annotations

import builtins
import sys
import types
from typing import Any


def make_function(
    code: types.CodeType,
    globals: dict[str, Any],
    name: str | None,
    argdefs: tuple[Any, ...] | None,
    closure: tuple[types.CellType, ...] | None,
) -> types.FunctionType:
    """A function of ``code`` whose globals, cells and attributes :func:`function_setstate`
    fills in once they are unpickled (they may refer back to the function)."""
    globals["__builtins__"] = builtins.__dict__
    return types.FunctionType(code, globals, name, argdefs, closure)


def function_setstate(function: types.FunctionType, state: tuple[dict[str, Any], Any]) -> None:
    """The attributes of the function, its globals and the contents of its cells, as
    cloudpickle's ``_function_setstate`` sets them."""
    attributes, slots = state
    function.__dict__.update(attributes)
    function_globals = slots.pop("__globals__")
    closure = slots.pop("__closure__")
    slots.pop("_cloudpickle_submodules")  # imported as it was unpickled: nothing left to do
    function.__globals__.update(function_globals)
    function.__globals__["__builtins__"] = builtins.__dict__
    if closure is not None:
        for cell, unpickled in zip(function.__closure__ or (), closure, strict=True):
            try:
                cell.cell_contents = unpickled.cell_contents
            except ValueError:  # an empty cell stays empty
                continue
    for name, value in slots.items():
        setattr(function, name, value)


def make_cell(*value: Any) -> types.CellType:
    """A closure's cell, holding ``value`` if given (cloudpickle's ``_make_cell`` and
    ``_make_empty_cell`` in one)."""
    return types.CellType(*value)


def subimport(name: str) -> types.ModuleType:
    """The module ``name``, imported (``__import__`` alone would give a submodule's
    package)."""
    __import__(name)
    return sys.modules[name]
