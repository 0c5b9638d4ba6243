"""What every command shares: the :class:`App` context object and option-set decorators."""

from __future__ import annotations

import dataclasses
import getpass
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
from rich.console import Console

from poisonq.client import Broker, connect
from poisonq.limits import MAX_OPERATOR

F = TypeVar("F", bound=Callable[..., Any])

# The commands that make something in the store, and so may make the store itself. Any other
# command pointed at a SQLite file that does not exist says so instead of creating it, so a
# mistyped --url is not an empty store that answers "no queue".
CREATING = frozenset({"queue create", "topic create", "topic subscribe", "serve"})


@dataclasses.dataclass
class App:
    """What every command needs: the store URL, the consoles and a broker opened on demand
    (so ``--help`` and usage errors never touch the store)."""

    url: str
    ctx: click.Context
    retry_total: int = 3
    out: Console = dataclasses.field(default_factory=lambda: _stdout())
    err: Console = dataclasses.field(default_factory=lambda: Console(stderr=True))
    _broker: Broker | None = dataclasses.field(default=None, init=False)

    @property
    def operator(self) -> str:
        """Who runs this command, for the task list: ``POISONQ_OPERATOR``, else the user and
        host of the command line."""
        named = " ".join(os.environ.get("POISONQ_OPERATOR", "").split())
        if named:
            return named[:MAX_OPERATOR]
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # no name for this uid (a container's)
            user = f"uid {os.getuid()}"
        return f"{user}@{socket.gethostname()} (cli)"[:MAX_OPERATOR]

    @property
    def broker(self) -> Broker:
        if self._broker is None:
            path = click.get_current_context().command_path  # "poisonq queue create"
            command = path.removeprefix(self.ctx.command_path).strip()
            broker = connect(self.url, create=command in CREATING, retry_total=self.retry_total)
            self._broker = self.ctx.with_resource(broker)
        return self._broker


PIPED_WIDTH = 160  # columns of a table written to a pipe or a file


def _stdout() -> Console:
    """The console of tables and reports. Written to a pipe or a file (``| less``, ``| grep``)
    it is as wide as a wide terminal, not rich's 80 columns, so no column is squeezed out;
    ``COLUMNS`` still says otherwise."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=PIPED_WIDTH)
    return console


def apply_options(options: Sequence[Callable[[F], F]]) -> Callable[[F], F]:
    """One decorator from several click options, so option sets are declared once."""

    def decorate(function: F) -> F:
        for option in reversed(options):
            function = option(function)
        return function

    return decorate
