"""Keeping a plain streaming query up through its poison rows: restart it where it failed.

A plain query through the ``poisonq`` source (a sink such as Parquet, no
:func:`~poisonq.spark.foreach_batch`) dies on a row that fails its job. Restarted from its
checkpoint, in this process or a new one, it replays the failed batch narrowed
(:mod:`poisonq.spark.narrowing`), so a few restarts isolate the row and its deliveries run
out while every other message is written. This is the restart loop a scheduler would run,
for a driver that wants the query to go on by itself; being there when the query dies, it
also gives a row that failed its batch alone the error the query died of.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from py4j.protocol import Py4JError
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.query import StreamingQuery

from poisonq.errors import InvalidOptionError
from poisonq.model import FailureRecord
from poisonq.spark.isolation import query_failure
from poisonq.spark.narrowing import abandon_alone
from poisonq.spark.session import quiet_query_errors
from poisonq.spark.source import SEQUENCE, TAG, StoreTag, tag_of
from poisonq.spark.stores import open_existing

log = logging.getLogger(__name__)


def run_restarting(start: Callable[[], StreamingQuery], max_restarts: int = 100) -> int:
    """Run the query ``start()`` starts until it ends (``trigger(availableNow=True)``, or
    ``stop()`` from another thread), starting it again from its checkpoint each time it
    fails; returns how many restarts it took. ``start`` must start the same query each time
    (same source options, same ``checkpointLocation``). After ``max_restarts`` restarts the
    next failure is raised (a sink that is down fails every batch, and no narrowing helps).
    Each failure is one line in the log, not the query's stacks (as for poisonq's own jobs:
    :func:`~poisonq.spark.session.quiet_query_errors`). A batch that failed with one message
    has that message abandoned with the query's error (its type, text and traceback), which
    the source's replay could only record as ``QueryFailed``."""
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
            failure = query_failure(exc)
            _settle_alone(query, failure)
            if restarts >= max_restarts:
                raise
            restarts += 1
            log.warning("streaming query failed (%s): restart %d", failure.message, restarts)
        finally:
            query.stop()


def _settle_alone(query: StreamingQuery, failure: FailureRecord) -> None:
    """Abandon, with the query's own error, the message of a batch that failed with it
    alone, so that its failure history tells what it raised, where, and its traceback (the
    source's replay would abandon it as ``QueryFailed``, knowing only that the query died).
    The batch's lease is its consumer's latest: Spark plans batch ``n + 1`` only after
    batch ``n`` committed."""
    tags = _source_tags(query)
    if len(tags) != 1:  # not the poisonq source, or two of them: whose message failed?
        return
    [tag] = tags
    with open_existing(tag.url) as broker:
        lease = broker.lease(tag.address, tag.consumer)
        if lease is not None:
            abandon_alone(broker, lease, tag.address, failure)


def _source_tags(query: StreamingQuery) -> list[StoreTag]:
    """The store tags of the query's ``poisonq`` sources, read from the ``sequence_number``
    metadata of its plan's leaves in the JVM; none over Spark Connect (no JVM here) or if
    the query died before it had a plan."""
    handle = getattr(query, "_jsq", None)
    if handle is None:
        return []
    tags: list[StoreTag] = []
    try:
        leaves = handle.streamingQuery().logicalPlan().collectLeaves().iterator()
        while leaves.hasNext():
            columns = leaves.next().output().iterator()
            while columns.hasNext():
                column = columns.next()
                if column.name() == SEQUENCE:
                    tag = json.loads(column.metadata().json()).get(TAG)
                    if isinstance(tag, dict):
                        tags.append(tag_of(tag))
    except Py4JError:
        return []
    return tags
