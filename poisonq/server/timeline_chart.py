"""A pipeline's timeline as an SVG bar chart, drawn on the server: the page allows no script
(see :data:`poisonq.server.app.CONTENT_SECURITY_POLICY`) and no inline style, so the chart is
geometry computed here and rendered by a template, coloured by the stylesheet's classes.

One bar per batch, oldest on the left: its height is the batch's time against the longest
batch, stacked by what became of its messages (completed at the bottom, then retried, then
dead-lettered), so a slow batch and a batch that dead-lettered much both stand out. Each bar
carries its figures in a ``<title>``, which browsers show on hover and screen readers read.
"""

from __future__ import annotations

from dataclasses import dataclass

from poisonq.timeline import PipelineBatch, per_second

WIDTH, HEIGHT = 800, 240
LEFT, RIGHT, TOP, BOTTOM = 56, 8, 12, 28  # margins: the y axis' labels, the x axis' labels
OUTCOMES = ("completed", "retried", "dead")  # bottom to top; class names of the stylesheet


@dataclass(frozen=True, slots=True)
class Segment:
    outcome: str
    y: float
    height: float


@dataclass(frozen=True, slots=True)
class Bar:
    lease: int
    x: float
    width: float
    segments: tuple[Segment, ...]
    title: str


@dataclass(frozen=True, slots=True)
class Tick:
    y: float
    label: str


@dataclass(frozen=True, slots=True)
class Chart:
    """What the template draws, in the coordinates of its ``viewBox``."""

    width: int
    height: int
    left: int
    baseline: float
    right: float
    bars: tuple[Bar, ...]
    ticks: tuple[Tick, ...]
    first: str  # the x axis' labels: the first and last leases shown
    last: str
    description: str


def describe(batch: PipelineBatch) -> str:
    """A batch's figures in a line, for its bar's tooltip."""
    reasons = ", ".join(f"{r or '(none)'} {n}" for r, n in sorted(batch.dead_lettered.items()))
    return (
        f"lease {batch.lease}: {batch.seconds:.2f} s, {batch.size} messages"
        f" ({per_second(batch.messages_per_second)}/s): {batch.completed} completed,"
        f" {batch.retried} retried, {batch.dead_lettered_total} dead-lettered"
        + (f" ({reasons})" if reasons else "")
        + (f", {batch.isolation_jobs} isolation jobs" if batch.isolation_jobs else "")
    )


def _segments(batch: PipelineBatch, top: float, height: float) -> tuple[Segment, ...]:
    counts = (batch.completed, batch.retried, batch.dead_lettered_total)
    total = sum(counts)
    if total == 0:
        return (Segment("completed", top, height),)
    segments, y = [], top + height  # stacked upwards from the baseline
    for outcome, count in zip(OUTCOMES, counts, strict=True):
        if count:
            part = height * count / total
            y -= part
            segments.append(Segment(outcome, round(y, 2), round(part, 2)))
    return tuple(segments)


def timeline_chart(batches: list[PipelineBatch]) -> Chart:
    """The chart of ``batches`` (at least one), in lease order."""
    plot_width, plot_height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    baseline = TOP + plot_height
    longest = max(b.seconds for b in batches) or 1.0
    slot = plot_width / len(batches)
    width = max(slot * 0.8, 1.0)
    bars = []
    for index, batch in enumerate(batches):
        height = max(plot_height * batch.seconds / longest, 1.0)  # a batch is never invisible
        x = LEFT + index * slot + (slot - width) / 2
        segments = _segments(batch, baseline - height, height)
        bars.append(Bar(batch.lease, round(x, 2), round(width, 2), segments, describe(batch)))
    ticks = tuple(
        Tick(round(baseline - plot_height * share, 2), f"{longest * share:.2f} s")
        for share in (0.0, 0.5, 1.0)
    )
    slowest = max(batches, key=lambda b: b.seconds)
    description = (
        f"{len(batches)} batches from lease {batches[0].lease} to {batches[-1].lease};"
        f" the longest, lease {slowest.lease}, took {slowest.seconds:.2f} s"
    )
    return Chart(
        WIDTH,
        HEIGHT,
        LEFT,
        baseline,
        WIDTH - RIGHT,
        tuple(bars),
        ticks,
        f"lease {batches[0].lease}",
        f"lease {batches[-1].lease}",
        description,
    )
