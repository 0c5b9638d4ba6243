"""``poisonq audit`` and ``poisonq demo``: the ledger balances, or the exit code says so."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

import poisonq
import poisonq.cli.ops
from poisonq import Broker, Message
from poisonq.cli import cli
from tests.cli.conftest import run, run_json
from tests.helpers import execute_behind_the_back


def test_audit_passes_then_fails_when_a_message_vanishes(
    url: str, api: Broker, orders: str
) -> None:
    api.sender(orders).send([Message(body=b"a"), Message(body=b"b")])
    report = run_json(url, "audit")
    assert report["ok"] is True and report["sent"] == 2 and report["held"] == 2
    assert "balanced" in run(url, "audit").stdout
    # A message lost behind the library's back: the ledger no longer balances.
    execute_behind_the_back(url, "DELETE FROM messages WHERE seq = (SELECT min(seq) FROM messages)")
    failing = run(url, "audit", "--json", code=1)
    assert json.loads(failing.stdout)["ok"] is False
    unbalanced = run(url, "audit", code=1).stdout
    assert "OUT OF BALANCE" in unbalanced and "sent 2 ≠ completed 0" in unbalanced


def test_the_engine_demo_checks_every_order(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    args = ["demo", "--engine", "--orders", "2000", "--dir", str(directory)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, (result.stdout, result.exception)
    assert "✗" not in result.stdout and result.stdout.count("✓") == 5
    assert "dlq list orders --by fingerprint" in result.stdout
    with poisonq.connect(f"sqlite:///{directory / 'demo.db'}") as broker:
        groups = {g.key: g.count for g in broker.dead_letter_groups("orders")}
        assert groups == {
            "UnknownCustomerError": 20,
            "MaxDeliveryCountExceeded": 10,
            "TTLExpiredException": 10,
        }
        assert broker.counts("orders")["completed"] == 1960


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), ("spark", 200_000, False, False)),
        (("--orders", "500"), ("spark", 500, False, False)),
        (("--map",), ("spark", 200_000, True, False)),
        (("--map", "--orders", "400"), ("spark", 400, True, False)),
        (("--without-job-failing",), ("spark", 200_000, False, True)),
        (("--engine",), ("engine", 20_000)),
        (("--engine", "--orders", "300"), ("engine", 300)),
    ],
)
def test_demo_runs_the_spark_pipeline_unless_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], expected: Any
) -> None:
    """Which demo runs (the Spark SQL transform, the per-row map with --map, the engine with
    --engine) and how many orders each sends by default. The demos are replaced by
    recorders: the Spark ones take minutes, and the engine one is run above."""
    calls: list[tuple[Any, ...]] = []

    def recorder(kind: str) -> Callable[..., None]:
        return lambda directory, orders, **options: calls.append(
            (kind, directory, orders, *options.values())
        )

    monkeypatch.setitem(sys.modules, "poisonq.spark.demo", SimpleNamespace(main=recorder("spark")))
    monkeypatch.setattr(poisonq.cli.ops, "run_demo", recorder("engine"))
    result = CliRunner().invoke(cli, ["demo", "--dir", str(tmp_path), *args])
    assert result.exit_code == 0, (result.stdout, result.exception)
    assert calls == [(expected[0], tmp_path, *expected[1:])]


def test_demo_refuses_engine_with_map(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["demo", "--engine", "--map", "--dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "--engine runs no Spark pipeline" in result.output
