"""Shared fixtures: real SQLite files in a temporary directory and a clock tests can move."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import poisonq
from poisonq import Broker, ManualClock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'queues.db'}"


@pytest.fixture
def broker(url: str, clock: ManualClock) -> Iterator[Broker]:
    with poisonq.connect(url, clock=clock) as opened:
        yield opened


@pytest.fixture
def queue(broker: Broker) -> str:
    """A queue named ``orders`` with 3 deliveries and a 30 s lock."""
    broker.create_queue("orders", max_delivery_count=3, lock_duration=30)
    return "orders"


def assert_balanced(broker: Broker) -> None:
    """The accounting invariant: sent = completed + dropped + held, per entity and overall."""
    report = broker.audit()
    bad = [entry for entry in report.entries if not entry.ok]
    assert not bad, f"ledger out of balance: {bad}"
    assert report.sent == report.completed + report.dropped + report.held


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local SparkSession for the whole run (starting one costs seconds)."""
    from poisonq.spark.session import local_session

    session = local_session("poisonq-tests")
    yield session
    session.stop()
