"""Running the engine's operations to their end from blocking code.

The engine's operations, and the store methods they call, are written once, as coroutines,
so that the same rules can run on a store whose driver waits on an event loop. On a blocking
store (SQLite, PostgreSQL through psycopg's blocking connections) nothing inside them ever
waits on a loop: a statement blocks the thread, as a plain call does, and the coroutine runs
from its start to its return in one step. :func:`drive` takes that step, with no event loop
(so a blocking caller pays for no loop, and one already running in its thread is not
disturbed).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def drive(operation: Coroutine[Any, Any, T]) -> T:
    """The result of ``operation``, run to its end in this thread. An operation that waits on
    an event loop (a store of an asynchronous driver) is a bug of its caller: it raises
    ``RuntimeError``, and the operation is closed, having done nothing more."""
    try:
        operation.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    operation.close()
    raise RuntimeError("an operation waited on an event loop: its store is not a blocking one")
