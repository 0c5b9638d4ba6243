"""``map_batches=`` after a crash, under the crash guard, on a real local SparkSession and real
SQLite files (PostgreSQL where marked)."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from poisonq import Broker
from poisonq.spark import Pipeline
from poisonq.spark.batches import CRASH_PARTS
from tests.helpers import assert_balanced, dead_letters_by_id, on_both_stores, spark_store_url
from tests.test_pipeline_batches import SCHEMA, orders, send, written

cloudpickle.register_pickle_by_value(sys.modules[__name__])
url = spark_store_url


class Broken(Exception):
    """Raised for a whole batch by the message it names (made permanent by the test)."""


class Declined(Exception):
    """Returned as the error of a ``declined`` order: a class of the job's own, which a
    child of the guard has loaded by value (made permanent by the test)."""


def crashing_orders(calls: Path) -> Any:
    """:func:`orders`, but a batch holding a ``crash`` order kills its Python process, one
    holding a ``broken`` order raises for the whole batch, and a ``declined`` order gets a
    :class:`Declined` error; each call appends the size of its batch to ``calls``."""

    def crashing(batch: pa.RecordBatch) -> Any:
        with open(calls, "a") as record:
            record.write(f"{batch.num_rows}\n")
        kinds = [json.loads(body)["kind"] for body in batch.column("body").to_pylist()]
        if "crash" in kinds:
            os._exit(3)
        if "broken" in kinds:
            raise Broken("a broken order in the batch")
        rows, errors = orders(batch)
        declined = [Declined("declined by the shop") if k == "declined" else None for k in kinds]
        return rows, [error or decline for error, decline in zip(errors, declined, strict=True)]

    return crashing


@on_both_stores
def test_after_a_crash_map_batches_runs_chunks_and_settles_every_other_message_by_its_own_outcome(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """Once a batch function killed its worker, the guard runs it on chunks of messages,
    not one message at a time: the chunk that crashes is halved down to the message that
    crashes alone (abandoned ``WorkerCrashed``: dead-lettered here, one delivery allowed),
    and every other message, in that chunk or not, ends as it would without the crash:
    written, filtered, rejected, dead-lettered by its returned exception (of the job's own
    class too), or traced to the exception its batch raised. A few calls run one message,
    not hundreds."""
    kinds = {3: "invalid", 5: "refused", 9: "skip", 11: "double"}
    kinds |= {7: "declined", 100: "crash", 101: "invalid", 102: "refused", 103: "declined"}
    kinds |= {200: "broken"}
    send(live, {n: {"kind": kind} for n, kind in kinds.items()}, 600, max_delivery_count=1)
    calls = tmp_path / "calls"
    report = Pipeline(
        spark, url=url, queue="orders", map_batches=crashing_orders(calls), schema=SCHEMA,
        output=str(tmp_path / "out"), permanent=(Broken, Declined),
    ).run()  # fmt: skip
    letters = dead_letters_by_id(live)
    assert sorted(letters) == ["o100", "o101", "o102", "o103", "o200", "o3", "o5", "o7"]
    reasons = {key: letter.dead_letter_reason for key, letter in letters.items()}
    assert reasons | {"o100": None} == {
        "o100": None,
        "o3": "PermanentError",
        "o101": "PermanentError",
        "o5": "Rejected",
        "o102": "Rejected",
        "o200": "Broken",
        "o7": "Declined",
        "o103": "Declined",
    }
    crashed = live.message("orders/$deadletterqueue", letters["o100"].sequence_number)
    assert crashed.failures[-1].error_type == "WorkerCrashed"
    assert report.completed == 592
    failed = {3, 5, 7, 100, 101, 102, 103, 200}
    assert written(spark, tmp_path / "out") == Counter(set(range(600)) - failed - {9}) + Counter(
        {11: 1}
    )
    sizes = [int(line) for line in calls.read_text().split()]
    # Alone: the crasher's last part (CRASH_PARTS messages), the broken order and its partner.
    assert sizes.count(1) <= CRASH_PARTS + 2
    assert len(sizes) < 100
    assert_balanced(live)
