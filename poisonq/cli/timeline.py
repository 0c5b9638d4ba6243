"""``poisonq pipeline list``, ``show`` and ``forget``: the consumers with a timeline, a
consumer's timeline (one row and one bar per batch), and forgetting a retired consumer.

A bar's length is the batch's time against the longest batch shown, so a slow batch stands
out; it is cut by what became of the batch's messages (completed, retried, dead-lettered), so
a batch that dead-lettered much stands out too. Needs no Spark: the store has the timeline.
"""

from __future__ import annotations

import click
from rich import box
from rich.console import Group, JustifyMethod, RenderableType
from rich.table import Table
from rich.text import Text

from poisonq.cli.app import App
from poisonq.cli.output import emit, json_option, short_time, table
from poisonq.timeline import PipelineBatch, per_second

MAX_BAR = 30  # cells of the longest batch's bar on a wide terminal
MIN_BAR = 6
REASONS_MIN = 7  # cells of the reasons on a narrow terminal ("Invali…" and the rest cut)
# Outcome, style and the bar's character for it (told apart without colour too).
OUTCOMES = (("completed", "green", "█"), ("retried", "yellow", "▒"), ("dead-lettered", "red", "░"))


def bar_width(console_width: int) -> int:
    """The longest bar's cells: a tenth of the terminal, so the numbers keep their room on
    80 columns and the bars theirs on a wide one."""
    return max(MIN_BAR, min(MAX_BAR, console_width // 10))


def batch_bar(batch: PipelineBatch, longest: float, width: int) -> Text:
    """The batch's bar: ``width`` cells for ``longest``, as long as its time is against that,
    cut by outcome."""
    length = max(1, round(width * batch.seconds / longest)) if longest > 0 else 1
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


# The columns' headings and justification. Every column but the reasons is as wide as its
# widest value (numbers are never cut); the reasons take what is left.
COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("lease", "right"), ("started", "left"), ("secs", "right"), ("size", "right"),
    ("done", "right"), ("retry", "right"), ("dead", "right"), ("reasons", "left"),
    ("jobs", "right"), ("msg/s", "right"), ("bar", "left"),
)  # fmt: skip


def timeline_view(consumer: str, batches: list[PipelineBatch], width: int) -> RenderableType:
    """The table for a terminal ``width`` columns wide: short headings, one space between
    columns, every number whole; the reasons (the one long text) in what is left, cut with
    an ellipsis (in full with --json); the bars a tenth of the width."""
    longest = max(b.seconds for b in batches)
    title = f"consumer {consumer} on {batches[0].queue}: {len(batches)} batch(es)"
    shown = Table(
        title=Text(title),
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=0,  # the box's divider is the one space between columns
    )
    bars = bar_width(width)
    rows = [
        [
            Text(str(cell))
            for cell in (
                b.lease, short_time(b.started_at), f"{b.seconds:.2f}", b.size, b.completed,
                b.retried, b.dead_lettered_total, _reasons(b), b.isolation_jobs,
                per_second(b.messages_per_second),
            )
        ] + [batch_bar(b, longest, bars)]
        for b in batches
    ]  # fmt: skip
    widths = [
        max(len(heading), *(row[index].cell_len for row in rows))
        for index, (heading, _) in enumerate(COLUMNS)
    ]
    reasons = [heading for heading, _ in COLUMNS].index("reasons")
    others = sum(widths) - widths[reasons] + len(COLUMNS) - 1  # one space between columns
    widths[reasons] = max(REASONS_MIN, min(widths[reasons], width - others))
    for row in rows:
        row[reasons].truncate(widths[reasons], overflow="ellipsis")
    for (heading, justify), cells in zip(COLUMNS, widths, strict=True):
        shown.add_column(heading, justify=justify, no_wrap=True, width=cells)
    for row in rows:
        shown.add_row(*row)
    legend = Text("bar: the batch's time; ")
    for name, style, char in OUTCOMES:
        legend.append(f"{char * 2} {name}  ", style=style)
    return Group(shown, legend)


@click.command("list")
@json_option
@click.pass_obj
def pipeline_list(app: App, as_json: bool) -> None:
    """List the pipeline consumers with a timeline: each one's queue, how many batches the
    store keeps of it, and its last batch (when, how long, how many messages, how many
    dead-lettered). Their names are what pipeline show takes."""
    summaries = app.broker.pipelines()
    if not summaries and not as_json:
        app.out.print("no pipeline has completed a batch yet (poisonq pipeline run starts one)")
        return
    rows = [
        [
            p.consumer,
            p.queue,
            p.batches,
            p.last.lease,
            short_time(p.last.started_at),
            f"{p.last.seconds:.2f}",
            p.last.size,
            p.last.dead_lettered_total,
            per_second(p.last.messages_per_second),
        ]
        for p in summaries
    ]
    columns = ["consumer", "queue", "batches", "last lease", "started", "secs", "size", "dead"]
    emit(
        app,
        as_json,
        [p.to_json() for p in summaries],
        lambda: table("pipelines", [*columns, "msg/s"], rows),
    )  # fmt: skip


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
    emit(app, as_json, data, lambda: timeline_view(consumer, batches, app.out.width))


@click.command("forget")
@click.argument("consumer")
@click.option(
    "--queue",
    "queue_name",
    help="The consumer's queue: needed only when the consumer runs on more than one.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Forget it even if its latest lease still holds messages (they go back to the queue).",
)
@click.pass_obj
def pipeline_forget(app: App, consumer: str, queue_name: str | None, force: bool) -> None:
    """Forget retired pipeline CONSUMER: its timeline and its settled leases.

    Its metrics (poisonq_pipeline_last_batch_*) go with them, and so does a
    PoisonqPipelineStalled alert about it. No message changes. A consumer whose latest
    lease still holds messages under a live lock may be running: refused (exit 2) unless
    --force, which gives those messages back to the queue first (no delivery counted).

    \b
      poisonq pipeline forget nightly-2023
      poisonq pipeline forget nightly --queue orders --force
    """
    gone = app.broker.forget_pipeline(consumer, queue_name, force=force)
    app.out.print(
        Text(f"forgot consumer {gone.consumer} on {gone.queue}: {gone.batches} batch(es)"),
        soft_wrap=True,
    )
