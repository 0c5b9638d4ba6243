"""The retried engine: each public operation retried over a store outage, as the outermost
call only, on an object of the engine's own type."""

from __future__ import annotations

import logging

import pytest

from poisonq import Broker
from poisonq.engine import Engine
from poisonq.engine.driving import drive
from poisonq.errors import StoreConflictError, StoreUnavailableError
from poisonq.retrying import OperationRetry, Reachability, retrying


class Flaky:
    """An engine-like class whose ``inner`` fails while the store is down, and whose
    ``outer`` operation calls ``inner`` inside."""

    def __init__(self, failures: int, error: StoreUnavailableError | None = None) -> None:
        self.failures = failures
        self.error = error or StoreUnavailableError("connection refused")
        self.inner_calls = 0
        self.outer_calls = 0
        self.in_doubt: list[bool] = []

    async def inner(self) -> str:
        self.inner_calls += 1
        if self.failures:
            self.failures -= 1
            raise self.error
        return "done"

    async def outer(self) -> str:
        self.outer_calls += 1
        return await self.inner()

    async def settle(self, *, in_doubt: bool = False) -> str:
        self.in_doubt.append(in_doubt)
        return await self.inner()


def retried_flaky(
    failures: int, retry_total: int = 2, error: StoreUnavailableError | None = None
) -> tuple[Flaky, Flaky]:
    flaky = Flaky(failures, error)
    retry = OperationRetry(retry_total=retry_total, retry_backoff_factor=0)
    return flaky, retrying(flaky, retry, Reachability("test"))


def test_an_operation_calling_another_is_retried_once_not_at_each_level() -> None:
    flaky, engine = retried_flaky(failures=10)
    with pytest.raises(StoreUnavailableError):
        drive(engine.outer())
    assert (flaky.outer_calls, flaky.inner_calls) == (3, 3)  # 1 + retry_total, not 3 * 3


def test_an_operation_succeeds_on_a_retry_after_the_store_comes_back() -> None:
    flaky, engine = retried_flaky(failures=2)
    assert drive(engine.outer()) == "done"
    assert flaky.outer_calls == 3


def test_a_retried_settlement_is_told_it_is_in_doubt() -> None:
    flaky, engine = retried_flaky(failures=1)
    assert drive(engine.settle()) == "done"
    assert flaky.in_doubt == [False, True]


def test_a_conflict_is_retried_without_being_logged_as_an_outage_or_in_doubt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A transaction the store gave up for another (a deadlock's victim) committed nothing
    on a store that answered: it is retried, not reported as unreachable, and a retried
    settlement is not told it may have landed."""
    conflict = StoreConflictError("deadlock detected")
    flaky, engine = retried_flaky(failures=1, error=conflict)
    with caplog.at_level(logging.WARNING, logger="poisonq.retrying"):
        assert drive(engine.settle()) == "done"
    assert flaky.in_doubt == [False, False]
    assert caplog.records == []


def test_the_retried_engine_is_an_engine_with_the_same_store_and_clock(broker: Broker) -> None:
    assert isinstance(broker.engine, Engine)
    assert broker.engine.store is broker.store
    assert broker.engine.clock is broker.clock
