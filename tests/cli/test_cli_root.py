"""The root command: help for every command, errors as one red line, the URL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import click
from click.testing import CliRunner

import poisonq
from poisonq.cli import cli
from tests.cli.conftest import assert_one_error_line, run


def _commands(
    group: click.Group, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def test_every_command_has_help(url: str) -> None:
    commands = dict(_commands(cli))
    expected = {("dlq", "resubmit"), ("queue", "create"), ("send",), ("pipeline", "run"), ("demo",)}
    assert expected <= set(commands)
    for path, command in commands.items():
        assert command.help, path
        shown = run(url, *path, "--help").stdout
        assert shown.startswith("Usage: ") and command.help.split()[0] in shown, path
        for option in command.params:
            if isinstance(option, click.Option) and option.name not in ("help", "version"):
                assert option.help, (path, option.name)


def test_an_unknown_queue_is_one_error_line_with_exit_code_2(url: str) -> None:
    for args in (["queue", "show", "nope"], ["peek", "nope"], ["dlq", "list", "nope"]):
        assert_one_error_line(run(url, *args, code=2), "'nope", "does not exist")


def test_an_invalid_option_is_one_error_line(url: str) -> None:
    result = run(url, "queue", "create", "orders", "--lock-duration", "900", code=2)
    assert_one_error_line(result, "lock_duration")


def test_the_url_comes_from_the_environment(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    result = CliRunner().invoke(cli, ["queue", "create", "q"], env={"POISONQ_URL": url})
    assert result.exit_code == 0, result.stderr
    with poisonq.connect(url) as broker:
        assert [q.name for q in broker.list_queues()] == ["q"]
