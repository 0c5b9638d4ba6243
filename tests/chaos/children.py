"""The programs the chaos suite kills, each run as ``python -m tests.chaos.children KIND ...``
in a process group of its own. What they did goes to stdout or a log, one flushed line at a
time, so that a kill leaves at most one torn last line."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TYPE_CHECKING

import poisonq

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ORDERS_SCHEMA = "message_id string, n long"
PATIENT = 6  # retries (about 50 s): a PostgreSQL restart under load outlasts the default 3


def order(n: int, kind: str = "good") -> poisonq.Message:
    """Message ``n`` of a scenario: ``kind`` is good, bad (raises ``PermanentError``) or
    crash (kills the process handling it)."""
    return poisonq.Message(body=json.dumps({"n": n, "kind": kind}), message_id=f"m{n}")


def handle_order(body: bytes) -> int:
    """What every program does with a message: its number, or the failure of its kind."""
    found = json.loads(body)
    if found["kind"] == "crash":
        os._exit(3)
    if found["kind"] == "bad":
        raise poisonq.PermanentError(f"order {found['n']} is bad")
    return int(found["n"])


def parse(message: dict[str, object]) -> dict[str, object]:
    """The per-row function of the pipeline scenario (``--schema ORDERS_SCHEMA``)."""
    body = message["body"]
    assert isinstance(body, bytes)
    return {"message_id": message["message_id"], "n": handle_order(body)}


def produce(url: str, queue: str, batches: int, size: int, first: int = 0) -> None:
    """Send batches of ``size`` orders numbered from ``first``; print a batch's number once
    its send has returned."""
    sender = poisonq.connect(url, retry_total=PATIENT).sender(queue)
    for b in range(batches):
        sender.send([order(first + b * size + i) for i in range(size)])
        print(b, flush=True)


def process(url: str, queue: str, log: str) -> None:
    """A ``Processor`` that logs when it starts a message (with its lock's expiry), when its
    handler is done, so that the parent can tell whether two held it at once, and the
    messages it handled well (its output)."""
    with poisonq.connect(url, retry_total=PATIENT) as broker, open(log, "a", buffering=1) as out:

        def handle(message: poisonq.ReceivedMessage) -> None:
            assert message.locked_until is not None
            until = message.locked_until.timestamp()
            held = f"{message.message_id} {message.lock_token}"
            out.write(f"S {held} {time.time()} {until}\n")
            try:
                handle_order(message.body)
                time.sleep(0.002)  # some work: the Processor does not drain a queue alone
            finally:
                out.write(f"E {held} {time.time()}\n")
            out.write(f"D {message.message_id}\n")  # handled: its output

        poisonq.Processor(broker, queue, handle, batch_size=20, concurrency=2).run(until_idle=True)


def crash_process(
    url: str, queue: str, batch_size: int, isolation: str, concurrency: int = 1
) -> None:
    """A ``Processor`` whose handler kills the process on a crash order, as a native library
    or the out-of-memory killer does (exit code 3); a supervisor starts it again. With
    ``isolation`` ``process`` the handler runs in a forked child and the worker lives on."""
    with poisonq.connect(url, retry_total=PATIENT) as broker:

        def handle(message: poisonq.ReceivedMessage) -> None:
            handle_order(message.body)

        poisonq.Processor(
            broker,
            queue,
            handle,
            batch_size=batch_size,
            concurrency=concurrency,
            isolation=None if isolation == "none" else "process",
        ).run(until_idle=True)


def stream(url: str, queue: str, output: str, checkpoint: str) -> None:
    """:func:`stream_on` a local session."""
    from poisonq.spark import local_session

    spark = local_session("chaos-stream")
    stream_on(spark, url, queue, output, checkpoint)
    spark.stop()


def stream_on(spark: SparkSession, url: str, queue: str, output: str, checkpoint: str) -> None:
    """A Structured Streaming query over the queue with the ``foreach_batch`` helper: a bad
    order fails an expectation, and each call writes its rows once, overwriting a directory
    named by its batch id and first sequence number (as docs/spark.md advises)."""
    from pyspark.sql import functions as F

    from poisonq.spark import foreach_batch

    def write(df: DataFrame, batch_id: int) -> None:
        first = df.agg(F.min("sequence_number")).first()
        if first is None or first[0] is None:
            return
        df.select("message_id").write.mode("overwrite").parquet(
            f"{output}/batch={batch_id}/first={first[0]}"
        )

    good = {"good": "get_json_object(cast(body AS string), '$.kind') = 'good'"}
    query = (
        orders_stream(spark, url, queue)
        .writeStream.foreachBatch(foreach_batch(write, good))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def orders_stream(spark: SparkSession, url: str, queue: str) -> DataFrame:
    """The queue as a stream, as the streaming scenarios read it: consumer ``chaos``,
    batches of 250, and a lock short enough that a killed query's lease runs out soon."""
    return (
        spark.readStream.format("poisonq")
        .option("url", url)
        .option("queue", queue)
        .option("consumer", "chaos")
        .option("maxMessagesPerBatch", 250)
        .option("lockDuration", 5)
        .load()
    )


def sink(url: str, queue: str, output: str, checkpoint: str) -> None:
    """A plain Structured Streaming query: the source into Spark's Parquet file sink, whose
    commit log makes a batch's files visible once."""
    from poisonq.spark import local_session

    spark = local_session("chaos-sink")
    query = (
        orders_stream(spark, url, queue)
        .select("message_id")
        .writeStream.format("parquet")
        .option("path", output)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


def write(url: str, queue: str, count: int) -> None:
    """``df.write.format("poisonq")`` of ``count`` orders in 8 partitions (a transaction
    each), every row with its ``message_id``, so that a rerun sends nothing twice."""
    from poisonq.spark import local_session

    spark = local_session("chaos-write")
    rows = spark.range(count, numPartitions=8).selectExpr(
        "concat('m', id) AS message_id",
        "to_json(named_struct('n', id, 'kind', 'good')) AS body",
    )
    rows.write.format("poisonq").option("url", url).option("queue", queue).mode("append").save()
    spark.stop()


def main() -> None:
    kind, *args = sys.argv[1:]
    if kind == "produce":
        produce(args[0], args[1], *map(int, args[2:]))
    elif kind == "process":
        process(*args)
    elif kind == "crash-process":
        crash_process(args[0], args[1], int(args[2]), args[3], *map(int, args[4:]))
    elif kind == "stream":
        stream(*args)
    elif kind == "sink":
        sink(*args)
    elif kind == "write":
        write(args[0], args[1], int(args[2]))
    else:
        raise SystemExit(f"unknown program {kind!r}")


if __name__ == "__main__":
    main()
