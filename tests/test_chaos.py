"""One run of each chaos scenario, small and seeded (``make chaos`` runs each 50 times: see
``tests/chaos``), and the check they end with, shown to catch what it looks for."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from random import Random

import pytest

import poisonq
from poisonq.testing.pgserver import TemporaryServer
from tests.chaos.scenarios import (
    Store,
    outage,
    pipeline,
    processor,
    producer,
    shared,
    source,
    streaming,
    writer,
)
from tests.chaos.verdict import Holding, Verdict, check, double_holders

Scenario = Callable[[Store, Path, Random], Verdict]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("scenario", [producer, processor], ids=["producer", "processor"])
def test_a_program_killed_mid_work_loses_and_duplicates_nothing(
    scenario: Scenario, url: str, tmp_path: Path
) -> None:
    verdict = scenario(Store(url), tmp_path, Random(7))
    assert verdict.faults == 1, "the kill came after the program had finished"
    assert verdict.ok, verdict.problems()


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    "scenario",
    [
        pipeline,
        streaming,
        source,
        writer,
    ],
    ids=["pipeline", "streaming", "source", "writer"],
)
def test_a_spark_program_killed_mid_batch_writes_each_message_once(
    scenario: Scenario, tmp_path: Path
) -> None:
    verdict = scenario(Store(f"sqlite:///{tmp_path / 'store.db'}"), tmp_path, Random(7))
    assert verdict.faults == 1, "the kill came after the program had finished"
    assert verdict.ok, verdict.problems()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_pipelines_and_a_processor_share_a_queue_and_handle_each_message_once(
    pg_url: str, tmp_path: Path
) -> None:
    verdict = shared(Store(pg_url), tmp_path, Random(7))
    assert verdict.faults == 1, "the kill came after the program had finished"
    assert verdict.ok, verdict.problems()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_postgresql_restart_under_a_producer_a_pipeline_and_a_processor_loses_nothing(
    own_server: TemporaryServer, tmp_path: Path
) -> None:
    store = Store(own_server.database_url("outage"), own_server)
    verdict = outage(store, tmp_path, Random(7))
    assert verdict.ok, verdict.problems()


def test_the_check_finds_lost_duplicated_and_misplaced_messages(tmp_path: Path) -> None:
    with poisonq.connect(f"sqlite:///{tmp_path / 'store.db'}") as broker:
        broker.create_queue("orders")
        broker.sender("orders").send(
            [poisonq.Message(body=b"{}", message_id=f"m{n}") for n in range(4)]
        )
        receiver = broker.receiver("orders")
        for message in receiver.receive(max_messages=2):
            receiver.dead_letter(message, reason="Wrong")  # m0 and m1
        verdict = check(
            broker,
            "orders",
            good=["m2", "m3"],
            bad={"m0": "Right", "m5": "Right"},
            output=["m2", "m2", "m9"],
        )
    assert verdict.lost == ["m3", "m5"]
    assert verdict.duplicated == ["m2"]
    assert verdict.misplaced == ["m9", "m0", "m1"]
    assert verdict.held == 2  # m2 and m3 are still in the queue
    assert verdict.balanced and not verdict.ok


def test_the_check_counts_completions_when_there_is_no_output(tmp_path: Path) -> None:
    with poisonq.connect(f"sqlite:///{tmp_path / 'store.db'}") as broker:
        broker.create_queue("orders")
        verdict = check(broker, "orders", good=["m1", "m2"], bad={}, output=None, completed=1)
    assert verdict.lost == ["1 completions"] and not verdict.duplicated


def test_two_holders_of_valid_locks_are_found() -> None:
    holdings = [
        Holding("a", start=0.0, until=5.0),
        Holding("a", start=6.0, until=9.0),  # after the first lock ran out: fine
        Holding("b", start=0.0, until=5.0),
        Holding("b", start=4.0, until=8.0),  # while the first lock was valid
    ]
    assert double_holders(holdings) == ["b"]
