"""What tests share besides fixtures: checks of the end state, stores reached behind the
engine's back, and messages to fill a queue with (fixtures stay in ``conftest.py``)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import poisonq
from poisonq import Broker, Message

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

STORES = ["sqlite", "postgresql"]


def store_url(request: pytest.FixtureRequest) -> str:
    """The URL of a fresh store of the kind ``request.param`` names."""
    return str(request.getfixturevalue(f"{request.param.replace('postgresql', 'pg')}_url"))


# Spark tests take seconds each, so their modules run on SQLite (``url = spark_store_url``);
# the tests marked ``on_both_stores`` also run on PostgreSQL, whose executors read from it.
spark_store_url = pytest.fixture(params=["sqlite"], name="url")(store_url)

# For modules whose ``url`` is SQLite only (the Spark suite, slow per test): run one test on
# both stores anyway.
on_both_stores = pytest.mark.parametrize("url", STORES, indirect=True)


def assert_balanced(broker: Broker) -> None:
    """The accounting invariant: sent = completed + dropped + held, per entity and overall."""
    report = broker.audit()
    bad = [entry for entry in report.rows if not entry.ok]
    assert not bad, f"ledger out of balance: {bad}"
    assert report.sent == report.completed + report.dropped + report.held


def recording_renewer() -> tuple[list[tuple[Any, poisonq.PoisonqError]], poisonq.AutoLockRenewer]:
    """An :class:`AutoLockRenewer` whose losses are recorded in the list returned with it, and
    whose thread never runs a pass: the test moves the clock and calls ``renew_due``."""
    lost: list[tuple[Any, poisonq.PoisonqError]] = []
    renewer = poisonq.AutoLockRenewer(60, lambda what, error: lost.append((what, error)), 3600)
    return lost, renewer


def fill(broker: Broker, queue: str, count: int, *, chunk: int = 1000, **fields: Any) -> list[int]:
    """Send ``count`` messages to ``queue`` in batches of ``chunk``; returns their sequence
    numbers. Message ``n`` has body ``b"b<n>"``, message id ``m<n>`` and the property ``n``;
    ``fields`` are given to every message (``properties`` are added to ``n``)."""
    extra = fields.pop("properties", {})
    seqs: list[int] = []
    for first in range(0, count, chunk):
        seqs += broker.sender(queue).send(
            [
                Message(
                    body=f"b{n}".encode(),
                    message_id=f"m{n}",
                    properties={"n": n, **extra},
                    **fields,
                )
                for n in range(first, min(count, first + chunk))
            ]
        )
    return seqs


def fill_orders(broker: Broker, count: int) -> list[int]:
    """``count`` orders (subject ``order``, property ``kind``) in the ``orders`` queue, as the
    Spark source's tests read them."""
    return fill(broker, "orders", count, subject="order", properties={"kind": "test"})


def dead_letters_by_id(broker: Broker, queue: str = "orders") -> dict[str, poisonq.ReceivedMessage]:
    return {m.message_id: m for m in broker.peek(f"{queue}/$deadletterqueue", max_messages=1000)}


def start_stream(
    spark: SparkSession,
    url: str,
    checkpoint: Path,
    handle: Callable[[Any, int], None],
    consumer: str,
    **options: str,
) -> StreamingQuery:
    """A streaming query of the ``orders`` queue through the source, each micro-batch given
    to ``handle`` (``foreachBatch``), as soon as the one before is done."""
    reader = (
        spark.readStream.format("poisonq")
        .option("url", url)
        .option("queue", "orders")
        .option("consumer", consumer)
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return (
        reader.load()
        .writeStream.foreachBatch(handle)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="0 seconds")
        .start()
    )


def script_versions(kind: str) -> list[int]:
    """The versions of the store's migration scripts (numbers may skip: see
    :func:`~poisonq.store.base.pending_migrations`)."""
    folder = resources.files("poisonq.store") / "migrations" / kind
    return sorted(int(p.name.split("_")[0]) for p in folder.iterdir() if p.name.endswith(".sql"))


def execute_behind_the_back(url: str, sql: str) -> list[tuple[object, ...]]:
    """Run ``sql`` on the store's database directly, as an outside program (or a bug) would;
    returns its rows."""
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            return db.execute(sql).fetchall()
    import psycopg

    with psycopg.connect(url) as conn:
        cur = conn.execute(sql.encode())
        return cur.fetchall() if cur.description else []


@dataclass(frozen=True)
class Orders:
    """A PostgreSQL queue ``orders`` of the chaos suite's orders, at ``url``: the message ids
    that must reach the output, and each bad one's reason (``PermanentError``)."""

    url: str
    broker: Broker
    good: set[str]
    bad: dict[str, str]

    @property
    def count(self) -> int:
        return len(self.good) + len(self.bad)

    def problems(self, output: list[str], reason: str | None = None) -> str:
        """What the chaos suite's end-state check finds wrong ("none"), every bad order
        dead-lettered with ``reason`` if given, else with its own."""
        from tests.chaos.verdict import check

        bad = dict.fromkeys(self.bad, reason) if reason else self.bad
        return check(self.broker, "orders", self.good, bad, output).problems()


SPAWN = multiprocessing.get_context("spawn")
START_TIMEOUT = 60.0  # a spawned interpreter imports pytest and poisonq before it is ready


def kill_while_holding(victim: BaseProcess, holding: EventType) -> None:
    """Start ``victim`` (a spawned process), wait until it sets ``holding`` (it took its
    locks), and SIGKILL it there: a crash at the worst moment, with nothing cleaned up."""
    try:
        victim.start()
        assert holding.wait(START_TIMEOUT), "the victim never received"
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
    finally:
        if victim.is_alive():
            victim.kill()
            victim.join(5)
    assert victim.exitcode == -signal.SIGKILL
