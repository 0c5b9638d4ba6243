"""Keeping a plain streaming query up through its poison rows: restart it where it failed.

A plain query through the ``poisonq`` source (a sink such as Parquet, no
:func:`~poisonq.spark.foreach_batch`) dies on a row that fails its job. Restarted from its
checkpoint, in this process or a new one, it replays the failed batch narrowed
(:mod:`poisonq.spark.narrowing`), so a few restarts isolate the row and its deliveries run
out while every other message is written. This is the restart loop a scheduler would run,
for a driver that wants the query to go on by itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.query import StreamingQuery

from poisonq.errors import InvalidOptionError
from poisonq.spark.session import quiet_query_errors

log = logging.getLogger(__name__)


def run_restarting(start: Callable[[], StreamingQuery], max_restarts: int = 100) -> int:
    """Run the query ``start()`` starts until it ends (``trigger(availableNow=True)``, or
    ``stop()`` from another thread), starting it again from its checkpoint each time it
    fails; returns how many restarts it took. ``start`` must start the same query each time
    (same source options, same ``checkpointLocation``). After ``max_restarts`` restarts the
    next failure is raised (a sink that is down fails every batch, and no narrowing helps).
    Each failure is one line in the log, not the query's stacks (as for poisonq's own jobs:
    :func:`~poisonq.spark.session.quiet_query_errors`)."""
    if not callable(start) or max_restarts < 0:
        raise InvalidOptionError(
            "run_restarting takes a function that starts the query and a max_restarts >= 0"
        )
    restarts = 0
    while True:
        query = start()
        try:
            with quiet_query_errors():
                query.awaitTermination()
            return restarts
        except StreamingQueryException as exc:
            if restarts >= max_restarts:
                raise
            restarts += 1
            log.warning("streaming query failed (%s): restart %d", _condition(exc), restarts)
        finally:
            query.stop()


def _condition(error: StreamingQueryException) -> str:
    """The error's class (``CAST_INVALID_INPUT``), or its first line."""
    condition = error.getCondition()
    return condition or str(error).splitlines()[0]
