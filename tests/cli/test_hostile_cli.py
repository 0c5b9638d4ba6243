"""Hostile command lines on both stores: every command that works on the store (not
``serve``, ``pipeline`` or ``demo``), its arguments and options of every wrong kind, taken
from the commands themselves. Bad input exits 2 with one error line and no traceback; the
ledger balances after every command (``tests/hostile.py``)."""

from __future__ import annotations

import click
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from poisonq import Broker
from poisonq.cli import cli
from tests.cli.conftest import all_commands, assert_one_error_line
from tests.helpers import assert_balanced
from tests.hostile import HOSTILE, SPECIAL_TEXT, any_char

# Options that would make a command wait for real (the CLI has the real clock): a receive's
# --wait, a resubmit's --rate, housekeep's --every (a loop until Ctrl-C).
WAITING = {"wait", "rate", "every"}


COMMANDS = {
    path: command
    for path, command in all_commands(cli)
    if not isinstance(command, click.Group) and path[-1] not in ("serve", "run", "demo")
}
# Text as a shell hands it over: bytes that are not UTF-8 arrive as lone surrogates.
words = st.sampled_from(["orders", "orders/$deadletterqueue", "-", "1", "-1", "2" * 30, "nan"]) | (
    st.sampled_from(SPECIAL_TEXT).filter(lambda t: "\x00" not in t)
    | st.text(any_char.filter(lambda c: c != "\x00"), max_size=20)
)


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    """A command, a word for each of its arguments, and some of its options with a word
    each (a flag alone)."""
    path = draw(st.sampled_from(sorted(COMMANDS)))
    command = COMMANDS[path]
    argv = list(path)
    for param in command.params:
        if isinstance(param, click.Argument):
            argv += [draw(words)] * (1 if param.nargs == 1 else draw(st.integers(0, 2)))
        elif param.name == "yes":
            argv.append("--yes")
        elif param.name not in WAITING and draw(st.booleans()):
            argv.append(param.opts[0])
            if not (isinstance(param, click.Option) and param.is_flag):
                argv.append(draw(words))
    return argv


@HOSTILE
@given(argv=command_lines(), stdin=st.sampled_from([b"", b"{", b'{"body": 1}\n', b"\xff\n"]))
def test_hostile_command_lines_exit_2_with_one_error_line(
    url: str, api: Broker, argv: list[str], stdin: bytes
) -> None:
    if not api.list_queues():
        api.create_queue("orders")
    result = CliRunner().invoke(cli, ["--url", url, *argv], input=stdin)
    # 1 is an answer, not an error: nothing matched (dlq purge, resubmit) or the audit failed.
    assert result.exit_code in (0, 1, 2), (argv, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        assert_one_error_line(result)
    assert_balanced(api)
