"""What the charts show: the windows an operator picks (the last hour, day or week) and
the bars they are cut into, and the series read from the store's history
(``poisonq/store/history.py``) for them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from poisonq.errors import InvalidOptionError
from poisonq.store.base import DeadLetterCount, DepthChange
from poisonq.store.history import HOUR, MINUTE


@dataclass(frozen=True, slots=True)
class Window:
    """The last ``length`` seconds in bars of ``step`` seconds, read from the history's
    buckets of ``span`` seconds (``step`` is a multiple of it). The last bar holds now."""

    length: int
    step: int
    span: int

    @property
    def bars(self) -> int:
        return self.length // self.step

    def start(self, now: float) -> int:
        """When the first bar begins."""
        return (int(now // self.step) - self.bars + 1) * self.step


WINDOWS = {
    "hour": Window(HOUR, MINUTE, MINUTE),
    "day": Window(24 * HOUR, 15 * MINUTE, MINUTE),
    "week": Window(7 * 24 * HOUR, HOUR, HOUR),
}
# The overview's small charts: the last day by the hour.
TREND = Window(24 * HOUR, HOUR, HOUR)


def window(name: str) -> Window:
    """The window ``name`` names, or :class:`InvalidOptionError` saying which there are."""
    try:
        return WINDOWS[name]
    except KeyError:
        known = ", ".join(WINDOWS)
        raise InvalidOptionError(f"window must be one of {known}, not {name!r}") from None


@dataclass(frozen=True, slots=True)
class Timeline:
    """Counts per bar from ``start`` in bars of ``step`` seconds, one series per key, the
    largest total first."""

    start: int
    step: int
    bars: int
    series: dict[str | None, list[int]]

    @property
    def totals(self) -> list[int]:
        """The count of every key together, bar by bar."""
        if not self.series:
            return [0] * self.bars
        return [sum(bar) for bar in zip(*self.series.values(), strict=True)]


@dataclass(frozen=True, slots=True)
class Trend:
    """A queue over a window: the highest depth in each bar (see :func:`peaks`), and the
    messages dead-lettered in each."""

    start: int
    step: int
    depth: list[int]
    dead_lettered: list[int]


def timeline(counts: Iterable[DeadLetterCount], frame: Window, now: float) -> Timeline:
    """The counts of the history binned into the window's bars, by key."""
    start = frame.start(now)
    series: defaultdict[str | None, list[int]] = defaultdict(lambda: [0] * frame.bars)
    for count in counts:
        bar = (count.bucket - start) // frame.step
        if 0 <= bar < frame.bars:
            series[count.key][bar] += count.count
    ordered = sorted(series.items(), key=lambda item: (-sum(item[1]), item[0] or ""))
    return Timeline(start, frame.step, frame.bars, dict(ordered))


def depths(changes: Iterable[DepthChange], held: int, frame: Window, now: float) -> list[int]:
    """The depth at the end of each bar of the window, read back from ``held`` (the depth
    now): before a bucket in which it changed, the depth was what that bucket opened with."""
    start = frame.start(now)
    later = sorted(changes, key=lambda change: change.bucket)
    values = [0] * frame.bars
    value = held
    for bar in reversed(range(frame.bars)):
        end = start + (bar + 1) * frame.step
        while later and later[-1].bucket >= end:
            value = later.pop().opened
        values[bar] = value
    return values


def peaks(changes: Iterable[DepthChange], held: int, frame: Window, now: float) -> list[int]:
    """The highest depth in each bar of the window: a backlog that came and went within a
    bar shows, where the depth at the bar's end would not. It is the highest of the bar's
    end, the depths its buckets opened with (the first is the bar's start) and their peaks
    (a bucket without one, from before schema 10, adds only its opening)."""
    changes = list(changes)
    values = depths(changes, held, frame, now)
    start = frame.start(now)
    for change in changes:
        bar = (change.bucket - start) // frame.step
        if 0 <= bar < frame.bars:
            reached = change.opened if change.peak is None else max(change.opened, change.peak)
            values[bar] = max(values[bar], reached)
    return values
