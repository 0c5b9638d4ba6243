"""The UI's charts as inline SVG drawn on the server (no script: the Content-Security-Policy
forbids every one), from the store's history (:mod:`poisonq.history`).

Geometry is computed here; ``templates/charts.html`` writes the markup, so every label (a
reason, a subject: untrusted text) is escaped by Jinja2 like any other value. Colours are CSS
classes of ``style.css`` (``s0`` … ``s7``), never inline styles, which the policy also forbids.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from poisonq.client import group_label
from poisonq.history import Timeline

WIDTH, HEIGHT = 720, 140  # the stacked chart's drawing, in its own units (it scales to the page)
SPARK_WIDTH, SPARK_HEIGHT = 80, 22
COLOURS = 7  # series drawn in a colour of their own, the largest first; the rest as "other"
OTHER = "s7"


@dataclass(frozen=True, slots=True)
class Rect:
    x: float
    y: float
    width: float
    height: float
    css: str
    title: str


@dataclass(frozen=True, slots=True)
class Stacked:
    """A stacked bar chart: one bar per step of the window, one colour per key."""

    rects: list[Rect]
    legend: list[tuple[str, str, int]]  # (css class, label, total)
    # Each bar with a count, for the table beside the drawing (what a screen reader reads):
    # (its time, [(label, count), ...]).
    values: list[tuple[str, list[tuple[str, int]]]]
    peak: int
    total: int
    since: str  # the label under the first bar ("24 h ago")


def colours(timeline: Timeline) -> dict[str | None, str]:
    """The CSS class of each key: its own colour for the largest, ``other`` for the rest."""
    return {key: f"s{n}" if n < COLOURS else OTHER for n, key in enumerate(timeline.series)}


def _bar_time(start: float, step: int) -> str:
    shown = datetime.fromtimestamp(start, UTC)
    return shown.strftime("%a %H:%M UTC" if step >= 3600 else "%H:%M UTC")


def stacked(timeline: Timeline, names: Mapping[str | None, str] | None = None) -> Stacked:
    """The timeline as stacked bars, the largest key at the bottom; a key is shown as
    ``names`` has it, else as itself."""
    names = names or {}
    css = colours(timeline)
    merged: dict[str, tuple[str, list[int]]] = {}
    for key, values in timeline.series.items():
        name = css[key]
        if name in merged:  # another of the "other" keys
            merged[name] = (
                merged[name][0],
                [a + b for a, b in zip(merged[name][1], values, strict=True)],
            )
        else:
            shown = "other" if name == OTHER else names.get(key, group_label(key))
            merged[name] = (shown, list(values))
    totals = timeline.totals
    peak = max(totals, default=0)
    width = WIDTH / timeline.bars
    rects = []
    per_bar: list[tuple[str, list[tuple[str, int]]]] = []
    for bar in range(timeline.bars):
        base = 0
        counted: list[tuple[str, int]] = []
        when = _bar_time(timeline.start + bar * timeline.step, timeline.step)
        for name, (shown, values) in merged.items():
            count = values[bar]
            if not count:
                continue
            top = HEIGHT * (base + count) / peak
            height = HEIGHT * count / peak
            rects.append(
                Rect(bar * width, HEIGHT - top, width, height, name, f"{when} · {shown}: {count}")
            )
            base += count
            counted.append((shown, count))
        if counted:
            per_bar.append((when, counted))
    legend = [(name, shown, sum(values)) for name, (shown, values) in merged.items()]
    since = _ago(timeline.bars * timeline.step)
    return Stacked(rects, legend, per_bar, peak, sum(totals), since)


@dataclass(frozen=True, slots=True)
class GroupChart:
    """The explorer's chart of a window, and each group's sparkline in its colour."""

    stacked: Stacked
    timeline: Timeline
    colours: dict[str | None, str]

    def spark(self, key: str | None) -> tuple[str, str, int]:
        """The ``points`` of the group's sparkline, its CSS class and its total."""
        values = self.timeline.series.get(key) or [0] * self.timeline.bars
        return sparkline(values), self.colours.get(key, OTHER), sum(values)


def group_chart(timeline: Timeline, names: Mapping[str | None, str] | None = None) -> GroupChart:
    return GroupChart(stacked(timeline, names), timeline, colours(timeline))


def _ago(seconds: int) -> str:
    days, hours = divmod(seconds // 3600, 24)
    return f"{days} d ago" if days and not hours else f"{seconds // 3600} h ago"


def sparkline(values: list[int], width: int = SPARK_WIDTH, height: int = SPARK_HEIGHT) -> str:
    """The ``points`` of a polyline through ``values`` from left to right, the largest at the
    top (a flat line at the bottom when every value is 0)."""
    peak = max(values, default=0) or 1
    step = width / max(len(values) - 1, 1)
    return " ".join(
        f"{n * step:.1f},{height - 1 - (height - 2) * value / peak:.1f}"
        for n, value in enumerate(values)
    )


def bars(values: list[int], width: int = SPARK_WIDTH, height: int = SPARK_HEIGHT) -> list[Rect]:
    """Small bars for ``values`` (none for a 0): a count per bar of a window."""
    peak = max(values, default=0) or 1
    each = width / max(len(values), 1)
    drawn = []
    for n, value in enumerate(values):
        if value:
            tall = height * value / peak
            drawn.append(Rect(n * each, height - tall, max(each - 0.5, 0.5), tall, "", ""))
    return drawn
