"""``poisonq topic create|subscribe``: topics and their filtered subscriptions."""

from __future__ import annotations

from typing import Any

import click

from poisonq.cli.app import App
from poisonq.cli.output import json_option
from poisonq.cli.queues import _queue_changes, _show_queue, queue_options


@click.group()
def topic() -> None:
    """Create topics and subscriptions (list and show them with 'poisonq queue')."""


@topic.command("create")
@click.argument("name")
@json_option
@click.pass_obj
def topic_create(app: App, /, name: str, as_json: bool) -> None:
    """Create a topic: what is sent to it goes to every subscription that matches."""
    _show_queue(app, app.broker.create_topic(name), as_json)


def _correlation(values: tuple[str, ...]) -> dict[str, Any]:
    pairs: dict[str, Any] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--correlation")
        pairs[key] = value
    return pairs


@topic.command("subscribe")
@click.argument("topic_name", metavar="TOPIC")
@click.argument("name")
@click.option("--filter", "sql", metavar="EXPR", help="SQL filter, e.g. \"region = 'eu'\".")
@click.option(
    "--correlation",
    multiple=True,
    metavar="NAME=VALUE",
    help="Correlation filter: the property equals the value (repeatable).",
)
@click.option(
    "--dead-letter-on-filter-exceptions",
    is_flag=True,
    help="Dead-letter a message the filter cannot evaluate instead of skipping it.",
)
@queue_options
@json_option
@click.pass_obj
def topic_subscribe(
    app: App,
    /,
    topic_name: str,
    name: str,
    sql: str | None,
    correlation: tuple[str, ...],
    dead_letter_on_filter_exceptions: bool,
    as_json: bool,
    **options: Any,
) -> None:
    """Create subscription TOPIC/subscriptions/NAME.

    Without --filter or --correlation it receives every message sent to TOPIC.
    """
    if sql and correlation:
        raise click.UsageError("give --filter or --correlation, not both")
    info = app.broker.create_subscription(
        topic_name,
        name,
        filter=sql or _correlation(correlation) or None,
        dead_letter_on_filter_evaluation_exceptions=dead_letter_on_filter_exceptions,
        **_queue_changes(options),
    )
    _show_queue(app, info, as_json)
