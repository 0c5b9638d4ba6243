"""Work slower than its locks, on the real clock: handlers that outlast ``lock_duration``
with the renewal a ``Processor`` gives them and without any, and a pipeline batch that runs
past its lease's lock. Nothing is lost or done twice, and no message is ever held by two
holders of valid locks."""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

import poisonq
from poisonq import Broker, MessageLockLostError
from poisonq.spark.pipeline import Pipeline
from tests.chaos.verdict import Holding, dead_lettered, double_holders
from tests.helpers import assert_balanced, fill

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
cloudpickle.register_pickle_by_value(sys.modules[__name__])

LOCK = 0.6  # seconds
SLOW = 1.5 * LOCK  # every handler outlasts its lock


def _orders(broker: Broker, count: int, **options: Any) -> None:
    broker.create_queue("orders", lock_duration=LOCK, **options)
    fill(broker, "orders", count)


def test_handlers_slower_than_their_locks_are_renewed_and_complete_once(url: str) -> None:
    holdings: list[Holding] = []

    def handle(message: poisonq.ReceivedMessage) -> None:
        start = time.time()
        time.sleep(SLOW)
        holdings.append(Holding(message.message_id, start, time.time()))

    with poisonq.connect(url) as broker:
        _orders(broker, 12, max_delivery_count=2)
        stats = poisonq.Processor(
            broker, "orders", handle, batch_size=3, concurrency=4, max_wait=LOCK
        ).run(until_idle=True)
        assert stats.completed == 12 and stats.lock_lost == 0
        assert broker.counts("orders")["completed"] == 12
        assert sorted(h.message_id for h in holdings) == sorted(f"m{n}" for n in range(12))
        assert not dead_lettered(broker, "orders")
        assert_balanced(broker)


def test_handlers_slower_than_unrenewed_locks_lose_them_and_never_share_a_message(
    url: str,
) -> None:
    """Two consumers that never renew: each delivery runs out before its handler is done, so
    every completion is refused, the message goes to the other consumer only once the lock
    has run out, and the lock expiries poison it."""
    holdings: list[Holding] = []
    refused = Counter[str]()
    guard = threading.Lock()

    def consume(broker: Broker) -> None:
        receiver = broker.receiver("orders")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            messages = receiver.receive(max_messages=1, max_wait=LOCK)
            if not messages:
                counts = broker.counts("orders")
                if not counts["active"] + counts["locked"]:
                    return
                continue
            (message,) = messages
            assert message.locked_until is not None
            start = time.time()
            time.sleep(SLOW)
            with guard:
                holdings.append(
                    Holding(message.message_id, start, message.locked_until.timestamp())
                )
            try:
                receiver.complete(message)
            except MessageLockLostError:
                with guard:
                    refused[message.message_id] += 1

    with poisonq.connect(url) as broker:
        _orders(broker, 4, max_delivery_count=2)
        brokers = [poisonq.connect(url) for _ in range(2)]
        threads = [threading.Thread(target=consume, args=(b,)) for b in brokers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=90)
        for b in brokers:
            b.close()
        assert not any(thread.is_alive() for thread in threads)
        assert double_holders(holdings) == []
        assert refused == {f"m{n}": 2 for n in range(4)}  # each of its two deliveries
        dead = dead_lettered(broker, "orders")
        assert sorted(m.message_id for m in dead) == [f"m{n}" for n in range(4)]
        assert {m.dead_letter_reason for m in dead} == {"MaxDeliveryCountExceeded"}
        assert broker.counts("orders")["completed"] == 0
        assert_balanced(broker)


def slow_row(message: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.01)  # 200 rows: a batch takes 2 s, several times its lease's lock
    return {"message_id": message["message_id"]}


def test_a_pipeline_batch_that_outlasts_its_lease_lock_is_renewed_and_written_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with poisonq.connect(url) as broker:
        _orders(broker, 400, max_delivery_count=1)  # a second delivery would dead-letter
        report = Pipeline(
            spark, url=url, queue="orders", map=slow_row, schema="message_id string",
            output=str(tmp_path / "out"), batch_size=200, lock_duration=LOCK,
        ).run()  # fmt: skip
        written = Counter(
            row.message_id for row in spark.read.parquet(str(tmp_path / "out")).collect()
        )
        assert written == Counter(f"m{n}" for n in range(400))
        assert report.completed == 400 and not report.dead_lettered
        assert broker.counts("orders")["completed"] == 400
        assert_balanced(broker)
