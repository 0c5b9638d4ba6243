"""A Python worker that dies in a ``transform=`` job is told as a crash (``WorkerCrashed``),
as under ``map=``, not as the Java error that carries it."""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import poisonq
from poisonq import Message
from poisonq.spark import Pipeline
from tests.helpers import assert_balanced, dead_letters_by_id

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _exit_on_seven(n: int) -> int:
    if n == 7:
        os._exit(3)
    return n


def _segfault_on_seven(n: int) -> int:
    if n == 7:
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    return n


@pytest.mark.parametrize(
    ("crash", "how"),
    [
        (_exit_on_seven, "its exit status is not reported by Spark"),
        (_segfault_on_seven, "Fatal Python error: Segmentation fault"),
    ],
)
def test_a_worker_crash_in_a_transform_job_is_described_as_a_crash_not_a_java_error(
    spark: SparkSession, tmp_path: Path, crash: Callable[[int], int], how: str
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    crashing = F.udf(crash, "long", useArrow=False)

    def transform(frame: DataFrame) -> DataFrame:
        n = F.get_json_object(F.col("body").cast("string"), "$.n").cast("long")
        return frame.select("sequence_number", crashing(n).alias("n"))

    with poisonq.connect(url) as live:
        live.create_queue("orders", lock_duration=60, max_delivery_count=1)
        live.sender("orders").send(
            [Message(body=f'{{"n": {n}}}', message_id=f"o{n}") for n in range(10)]
        )
        Pipeline(
            spark, url=url, queue="orders", transform=transform, output=str(tmp_path / "out")
        ).run()
        crashed = dead_letters_by_id(live)["o7"]
        assert [f.error_type for f in crashed.failures] == ["WorkerCrashed"]
        assert crashed.dead_letter_error_description == (
            f"WorkerCrashed: the Python process handling this message died ({how})"
        )
        assert len(dead_letters_by_id(live)) == 1
        assert_balanced(live)
