"""The root command: help for every command, errors as one red line, the URL."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import poisonq
from poisonq import Broker
from poisonq.cli import cli
from poisonq.cli.app import CREATING
from tests.cli.conftest import all_commands, assert_one_error_line, run


def test_every_command_has_help(url: str) -> None:
    commands = dict(all_commands(cli))
    expected = {("dlq", "resubmit"), ("queue", "create"), ("send",), ("pipeline", "run"), ("demo",)}
    assert expected <= set(commands)
    for path, command in commands.items():
        assert command.help, path
        shown = run(url, *path, "--help").stdout
        assert shown.startswith("Usage: ") and command.help.split()[0] in shown, path
        for option in command.params:
            if isinstance(option, click.Option) and option.name not in ("help", "version"):
                assert option.help, (path, option.name)


def test_an_unknown_queue_is_one_error_line_with_exit_code_2(url: str, api: Broker) -> None:
    for args in (["queue", "show", "nope"], ["peek", "nope"], ["dlq", "list", "nope"]):
        assert_one_error_line(run(url, *args, code=2), "error: no queue 'nope'")


def test_an_unknown_queue_is_named_as_typed_with_the_closest_names(url: str, orders: str) -> None:
    for args in (
        ["peek", "ordres"],
        ["peek", "ordres;poison"],
        ["dlq", "list", "ordres"],
        ["dlq", "show", "ordres", "1"],
        ["send", "ordres", "x"],
    ):
        result = run(url, *args, code=2)
        assert result.stderr == "error: no queue 'ordres'; did you mean 'orders'?\n", args


def test_an_invalid_option_is_one_error_line(url: str) -> None:
    result = run(url, "queue", "create", "orders", "--lock-duration", "900", code=2)
    assert_one_error_line(result, "lock_duration")


def test_a_usage_error_is_one_error_line_naming_the_help(url: str) -> None:
    """Click's usage errors were four lines (usage, hint, a blank, the error)."""
    bad = run(url, "queue", "create", "orders", "--max-delivery-count", "x", code=2)
    assert_one_error_line(bad, "'x' is not a valid integer", "queue create --help)")
    assert_one_error_line(run(url, "send", code=2), "Missing argument 'ADDRESS'")
    assert_one_error_line(run(url, "queue", "bogus", code=2), "No such command 'bogus'")
    assert run(url, "queue", code=2).stderr.startswith("Usage: ")  # a group alone: its help
    # The root's own options too (were click's three lines):
    assert_one_error_line(run(url, "--retry-total", "-1", "audit", code=2), "--retry-total")
    assert_one_error_line(run(url, "--nope", "audit", code=2), "No such option '--nope'")


def test_the_url_comes_from_the_environment(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    result = CliRunner().invoke(cli, ["queue", "create", "q"], env={"POISONQ_URL": url})
    assert result.exit_code == 0, result.stderr
    with poisonq.connect(url) as broker:
        assert [q.name for q in broker.list_queues()] == ["q"]


USING = [
    ["queue", "list"],
    ["queue", "show", "orders"],
    ["queue", "update", "orders", "--lock-duration", "5"],
    ["queue", "disable", "orders"],
    ["peek", "orders"],
    ["dlq", "list", "orders"],
    ["dlq", "show", "orders", "1"],
    ["dlq", "resubmit", "orders"],
    ["dlq", "purge", "orders", "--yes"],
    ["audit"],
    ["receive", "orders"],
    ["send", "orders", "hello"],
]


@pytest.mark.parametrize("args", USING, ids=" ".join)
def test_a_command_that_uses_a_store_never_creates_one(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = run("sqlite:///nope.db", *args, code=2)
    missing = tmp_path / "nope.db"
    assert_one_error_line(
        result, f"error: no poisonq store at {missing} (create one with: poisonq queue create NAME)"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_pipeline_run_on_a_missing_store_creates_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It needs a queue that exists; before, it left an empty store behind."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text("def transform(message):\n    return None\n")
    args = ("pipeline", "run", "job.py:transform", "--queue", "orders", "--schema", "n long")
    result = run("sqlite:///nope.db", *args, "--output", "out", code=2)
    assert_one_error_line(result, "no poisonq store at")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.py"]


def test_the_commands_that_make_something_make_the_store(tmp_path: Path) -> None:
    assert {" ".join(path) for path, _ in all_commands(cli)} >= CREATING
    run(f"sqlite:///{tmp_path / 'queues.db'}", "queue", "create", "orders")
    run(f"sqlite:///{tmp_path / 'topics.db'}", "topic", "create", "events")
    with poisonq.connect(f"sqlite:///{tmp_path / 'topics.db'}", create=False) as broker:
        assert [q.name for q in broker.list_queues()] == ["events"]


def test_retry_total_sets_how_often_a_store_outage_is_retried(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--retry-total`` (or POISONQ_RETRY_TOTAL) is the budget of every store operation of
    the command, opening the store included: a server that is down is tried that many times
    more, then the command fails in one line."""
    with socket.socket() as probe:  # a port nobody listens on: the server is down
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    down = f"postgresql://postgres@127.0.0.1:{port}/poisonq"
    for option, env, retries in (
        (["--retry-total", "0"], {}, 0),
        ([], {"POISONQ_RETRY_TOTAL": "1"}, 1),
    ):
        caplog.clear()
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        with caplog.at_level(logging.DEBUG, logger="poisonq"):
            result = CliRunner().invoke(cli, ["--url", down, *option, "audit"])
        assert result.exit_code == 2, result.output
        assert_one_error_line(result, "cannot open PostgreSQL store")
        assert sum("retrying in" in r.getMessage() for r in caplog.records) == retries
    refused = CliRunner().invoke(cli, ["--retry-total", "-1", "audit"])
    assert refused.exit_code == 2 and "-1 is not in the range x>=0" in refused.output


@pytest.mark.parametrize(
    "args",
    [["send", "orders", "--file", "\ud800"], ["serve", "--token-file", "\ud800"]],
    ids=["send --file", "serve --token-file"],
)
def test_a_path_the_file_system_cannot_name_is_one_error_line(
    tmp_path: Path, args: list[str]
) -> None:
    result = CliRunner().invoke(cli, ["--url", f"sqlite:///{tmp_path / 'q.db'}", *args])
    assert result.exit_code == 2, result.output
    assert_one_error_line(result, "is not a path this system can name")
