"""``poisonq housekeep``: time passing where nobody reads, and the loop ``poisonq serve``
runs for the same.

Every read of an entity applies what is due of it first, so nothing here is needed for what
a reader sees. What no read of the entity itself would apply is what its time moves
elsewhere: a poison message rejected into another queue's dead-letter queue, a dead letter
forwarded on, the charts' history stamped when it happened. A pass applies what is due
everywhere, one transaction per entity; ``--every`` repeats it (for cron, a sidecar, or a
store no server watches).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime

import click

from poisonq.cli.app import App
from poisonq.cli.output import emit, json_option
from poisonq.client import Broker
from poisonq.errors import StoreError

log = logging.getLogger(__name__)


def keep_time(
    broker: Broker, every: float, stop: threading.Event, report: Callable[[list[str]], None]
) -> None:
    """Housekeeping passes ``every`` seconds apart until ``stop`` is set; ``report`` gets the
    entities of each pass where something was due. A store that fails a pass (an outage
    past the client's retries) is tried again at the next one."""
    while not stop.is_set():
        try:
            report(broker.housekeep())
        except StoreError as exc:
            log.warning("housekeeping pass failed (%s); next in %g s", exc, every)
        stop.wait(every)


@click.command()
@click.option(
    "--every",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Repeat the pass every SECONDS until stopped (Ctrl-C), printing a line for each"
    " pass that applied something (with --json, one JSON object a line).",
)
@json_option
@click.pass_obj
def housekeep(app: App, /, every: float | None, as_json: bool) -> None:
    """Apply what is due on the store's clock to every entity.

    Expired locks (and the poison action they trigger), time-to-lives that passed,
    scheduled messages and retry cycles whose time came, the auto-disable they may cause.
    Every read applies as much for what it reads; this is for what nobody reads.
    """
    if every is None:
        names = app.broker.housekeep()
        emit(app, as_json, {"applied": names}, lambda: _line(names))
        return

    def report(names: list[str]) -> None:  # a line per pass that applied something
        if names and as_json:
            click.echo(json.dumps({"at": _now(), "applied": names}))
        elif names:
            app.out.print(f"{_now()} {_line(names)}", soft_wrap=True)

    with contextlib.suppress(KeyboardInterrupt):
        keep_time(app.broker, every, threading.Event(), report)


def _line(names: list[str]) -> str:
    return f"applied what was due to {', '.join(names)}" if names else "nothing was due"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
