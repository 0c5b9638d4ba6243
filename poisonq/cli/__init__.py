"""The ``poisonq`` command line: admin, send/receive/peek, the dead-letter queue, tasks,
audit, pipeline and demo.

This module holds the root group (``--url``, error handling) and ``main``; each command
family lives in its own module and is attached here. Human output is rich tables on stdout
and progress bars on stderr (only on a terminal, so pipes and ``--json`` stay clean). Every
listing takes ``--json``. A :class:`PoisonqError` (or a usage error) is the user's problem, not a
bug, so it is printed as one red ``error:`` line with exit code 2 instead of a traceback.
"""

from __future__ import annotations

from typing import Any, NoReturn

import click
from click.exceptions import NoArgsIsHelpError
from rich.console import Console
from rich.text import Text

from poisonq.cli.app import App
from poisonq.cli.dlq import dlq
from poisonq.cli.housekeeping import housekeep
from poisonq.cli.messages import peek, receive, send
from poisonq.cli.ops import audit, demo
from poisonq.cli.pipeline import pipeline
from poisonq.cli.queues import queue
from poisonq.cli.serve import serve
from poisonq.cli.tasks import task
from poisonq.cli.timeline import pipeline_forget, pipeline_list, pipeline_show
from poisonq.cli.topics import topic
from poisonq.client import DEFAULT_URL
from poisonq.errors import PoisonqError, StoreNotFoundError


class _Cli(click.Group):
    """The root group: turns a :class:`PoisonqError` from any command, and a usage error of
    its own options or of any command's arguments, into one red line."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            if isinstance(exc, NoArgsIsHelpError):
                raise
            _fail(ctx, _usage_line(exc))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PoisonqError as exc:
            line = str(exc)
            if isinstance(exc, StoreNotFoundError):
                line += " (create one with: poisonq queue create NAME)"
        except click.UsageError as exc:
            if isinstance(exc, NoArgsIsHelpError):
                raise  # a group called alone: its help, as click shows it
            line = _usage_line(exc)
        _fail(ctx, line)


def _usage_line(exc: click.UsageError) -> str:
    line = exc.format_message()
    return line + (f" (see: {exc.ctx.command_path} --help)" if exc.ctx is not None else "")


def _fail(ctx: click.Context, line: str) -> NoReturn:
    line = " ".join(line.split())
    Console(stderr=True).print(Text(f"error: {line}", style="red"), soft_wrap=True)
    ctx.exit(2)


@click.group(cls=_Cli)
@click.option(
    "--url",
    envvar="POISONQ_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="Store URL: sqlite:///path.db (also from POISONQ_URL).",
)
@click.option(
    "--retry-total",
    envvar="POISONQ_RETRY_TOTAL",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Retries of a store operation over an outage (a PostgreSQL restart), about 0.8 s,"
    " 1.6 s, 3.2 s ... apart (also from POISONQ_RETRY_TOTAL).",
)
@click.version_option(package_name="poisonq")
@click.pass_context
def cli(ctx: click.Context, url: str, retry_total: int) -> None:
    """poisonq: a durable message queue with poison-message handling.

    \b
    Examples:
      poisonq queue create orders --max-delivery-count 5
      poisonq send orders '{"id": 1}' --subject order --property region=eu
      poisonq send orders --file orders.jsonl
      poisonq receive orders --max 10
      poisonq dlq list orders --by fingerprint
      poisonq dlq show orders 42
      poisonq dlq resubmit orders --reason MaxDeliveryCountExceeded --rate 200
      poisonq task list --queue orders
      poisonq queue resolve orders 42 --action resubmit
      poisonq topic subscribe events eu --filter "region = 'eu'"
      poisonq audit
      poisonq housekeep --every 5
      poisonq serve --port 8080 --open-reads
      poisonq pipeline run jobs/orders.py:transform --queue orders --output out/orders
      poisonq pipeline show pipeline
    """
    ctx.obj = App(url, ctx, retry_total=retry_total)


for _command in (
    queue,
    topic,
    send,
    receive,
    peek,
    dlq,
    task,
    audit,
    housekeep,
    serve,
    pipeline,
    demo,
):
    cli.add_command(_command)
pipeline.add_command(pipeline_list)
pipeline.add_command(pipeline_show)
pipeline.add_command(pipeline_forget)


def main() -> None:
    """The console script ``poisonq``."""
    cli()


__all__ = ["cli", "main"]
