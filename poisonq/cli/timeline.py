"""``poisonq pipeline show``: a pipeline consumer's timeline, one row and one bar per batch.

A bar's length is the batch's time against the longest batch shown, so a slow batch stands
out; it is cut by what became of the batch's messages (completed, retried, dead-lettered), so
a batch that dead-lettered much stands out too. Needs no Spark: the store has the timeline.
"""

from __future__ import annotations

import click
from rich.console import Group, RenderableType
from rich.text import Text

from poisonq.cli.app import App
from poisonq.cli.output import emit, json_option, short_time, table
from poisonq.timeline import PipelineBatch

BAR_WIDTH = 30
# Outcome, style and the bar's character for it (told apart without colour too).
OUTCOMES = (("completed", "green", "█"), ("retried", "yellow", "▒"), ("dead-lettered", "red", "░"))


def batch_bar(batch: PipelineBatch, longest: float) -> Text:
    """The batch's bar: as long as its time is against ``longest``, cut by outcome."""
    length = max(1, round(BAR_WIDTH * batch.seconds / longest)) if longest > 0 else 1
    parts = (batch.completed, batch.retried, batch.dead_lettered_total)
    total = sum(parts)
    bar = Text()
    if total == 0:
        return bar.append("·" * length, style="dim")
    drawn = 0
    for count, (_, style, char) in zip(parts, OUTCOMES, strict=True):
        cells = round(length * (drawn + count) / total) - round(length * drawn / total)
        bar.append(char * max(cells, 1 if count else 0), style=style)  # one message shows
        drawn += count
    return bar


def _reasons(batch: PipelineBatch) -> str:
    by_reason = sorted(batch.dead_lettered.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{reason or '(none)'} {count}" for reason, count in by_reason)


def timeline_view(consumer: str, batches: list[PipelineBatch]) -> RenderableType:
    longest = max(b.seconds for b in batches)
    rows = [
        [
            b.lease,
            short_time(b.started_at),
            f"{b.seconds:.2f}",
            b.size,
            b.completed,
            b.retried,
            b.dead_lettered_total,
            _reasons(b),
            b.isolation_jobs,
            f"{b.messages_per_second:,.0f}",
            batch_bar(b, longest),
        ]
        for b in batches
    ]
    columns = [
        "lease", "started", "seconds", "size", "completed", "retried", "dead-lettered",
        "reasons", "isolation jobs", "msgs/s", "time and outcome",
    ]  # fmt: skip
    title = f"consumer {consumer} on {batches[0].queue}: {len(batches)} batch(es)"
    legend = Text("bar: the batch's time; ")
    for name, style, char in OUTCOMES:
        legend.append(f"{char * 2} {name}  ", style=style)
    return Group(table(title, columns, rows), legend)


@click.command("show")
@click.argument("consumer")
@click.option(
    "--queue",
    "queue_name",
    help="The consumer's queue: needed only when the consumer runs on more than one.",
)
@click.option(
    "--last",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    help="Show the newest this many of the batches kept.",
)
@json_option
@click.pass_obj
def pipeline_show(
    app: App, consumer: str, queue_name: str | None, last: int, as_json: bool
) -> None:
    """Show the timeline of pipeline CONSUMER: its last batches (--last), oldest first.

    Each batch is a lease the pipeline completed (--consumer of pipeline run, default
    "pipeline"): when its Spark job started, how long it ran, how many messages it held and
    what became of them (completed, retried by the queue's policy, dead-lettered by reason),
    the isolation jobs it took to find the messages that failed its job, and its messages
    per second. The bar is the batch's time against the longest shown, cut by outcome. The
    store keeps the last --keep-batches batches of each consumer (default 1,000).

    \b
      poisonq pipeline show pipeline
      poisonq pipeline show nightly --queue orders --last 500 --json
    """
    batches = app.broker.pipeline_batches(consumer, queue_name)[-last:]
    data = [b.to_json() for b in batches]
    emit(app, as_json, data, lambda: timeline_view(consumer, batches))
