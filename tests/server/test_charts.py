"""The charts of the explorer and the overview (inline SVG from the store's history), the
causes a reason hides, and the explorer's search fields."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from fastapi.testclient import TestClient

from poisonq import Broker, ManualClock, Message
from poisonq.history import WINDOWS, Timeline
from poisonq.server import charts
from poisonq.server.charts import HEIGHT, bars, sparkline, stacked

TIMES = "\N{MULTIPLICATION SIGN}"


def _figure(page: str) -> str:
    found = re.search(r'<figure class="chart" id="chart">(.*?)</figure>', page, re.S)
    assert found, page
    return found.group(1)


def test_the_explorer_charts_the_dead_letterings_by_the_grouping(
    open_client: TestClient, dead: dict[str, list[int]]
) -> None:
    page = open_client.get("/ui/deadletters?queue=orders").text
    chart = _figure(page)
    # The drawing is for the eye; a screen reader reads the summary and each bar's counts.
    assert '<svg viewBox="0 0 720 140" preserveAspectRatio="none" aria-hidden="true"' in chart
    # everything happened now: the last bar holds it, stacked by reason
    assert re.findall(r"<title>[^<]*· (\w+): (\d+)</title>", chart) == [
        ("InvalidOrder", "3"),  # a tie: by name
        ("MaxDeliveryCountExceeded", "3"),
    ]
    assert '<span class="sr-only">Messages dead-lettered over the last day by reason: 6' in chart
    [row] = re.findall(
        r'<table class="grid" id="chart-values">.*?<tbody>(.*?)</tbody>', chart, re.S
    )
    assert re.findall(r'<span class="mono">(\w+)</span> (\d+)', row) == [
        ("InvalidOrder", "3"),
        ("MaxDeliveryCountExceeded", "3"),
    ]
    assert re.search(r'<li><span class="swatch s0"></span><span class="mono">InvalidOrder', chart)
    # a sparkline per group row, in its key's colour
    rows = re.findall(r'<polyline class="(s\d)" points="([^"]+)"/>', page)
    assert [css for css, _ in rows] == ["s0", "s1"]
    assert all(len(points.split()) == WINDOWS["day"].bars for _, points in rows)


def test_window_links_redraw_the_chart_and_keep_the_selection(
    open_client: TestClient, dead: dict[str, list[int]]
) -> None:
    page = open_client.get("/ui/deadletters?queue=orders&by=subject&subject=refund").text
    links = dict(re.findall(r'<a href="(\?[^"]+)">(hour|week)</a>', page))
    assert set(links.values()) == {"hour", "week"}
    assert '<strong aria-current="true">✓ day</strong>' in page
    for link, name in links.items():
        query = parse_qs(urlsplit(link.replace("&amp;", "&")).query)
        assert query["window"] == [name] and query["subject"] == ["refund"]
        answer = open_client.get("/ui/deadletters" + link.replace("&amp;", "&"))
        assert answer.status_code == 200
        assert f"Dead-lettered over the last {name}, by subject" in answer.text
        bars_drawn = WINDOWS[name].bars
        assert len(re.findall(r'points="([^"]+)"', answer.text)[0].split()) == bars_drawn
        # the other links of the page keep the window
        assert f'name="window" value="{name}"' in answer.text
        assert f"window={name}" in re.search(r'href="(\?[^"]*by=reason[^"]*)"', answer.text)[1]  # type: ignore[index]


def test_a_window_that_is_not_one_is_a_400_on_the_page(
    open_client: TestClient, dead: dict[str, list[int]]
) -> None:
    answer = open_client.get("/ui/deadletters?queue=orders&window=month")
    assert answer.status_code == 400
    assert 'id="bad-window" role="alert">No chart: window must be one of hour, day, week' in (
        answer.text
    )
    assert 'id="chart"' not in answer.text
    assert 'id="groups"' in answer.text and 'id="messages"' in answer.text  # the rest is there
    assert "Traceback" not in answer.text


def test_chart_labels_are_escaped(open_client: TestClient, dead: dict[str, list[int]]) -> None:
    page = open_client.get("/ui/deadletters?queue=orders&by=subject").text
    assert "<b>refund</b>" not in page
    assert "&lt;b&gt;refund&lt;/b&gt;: 1</title>" in _figure(page)


def test_a_reason_shows_the_causes_it_hides_with_a_sample(
    open_client: TestClient, dead: dict[str, list[int]]
) -> None:
    page = open_client.get("/ui/deadletters?queue=orders").text
    row = re.search(
        r"MaxDeliveryCountExceeded</a></td>\s*<td class=\"n\">3</td>\s*"
        r"<td class=\"causes\">(.*?)</td>",
        page,
        re.S,
    )
    assert row, page
    sample = dead["MaxDeliveryCountExceeded"][0]
    assert re.fullmatch(
        rf'<a href="message\?address=orders%2F%24deadletterqueue&amp;seq={sample}"'
        r' title="KeyError: 3 \(a sample: message \d+\)"><span class="mono">KeyError</span>'
        f" {TIMES}3</a>",
        row.group(1),
    ), row.group(1)
    invalid = re.search(
        r"InvalidOrder</a></td>\s*<td class=\"n\">3</td>\s*"
        r"<td class=\"causes\">(.*?)</td>",
        page,
        re.S,
    )
    assert invalid and f">ValueError</span> {TIMES}2</a>, <a" in invalid.group(1)
    assert f"(never failed)</span> {TIMES}1" in invalid.group(1)
    assert (
        open_client.get(f"/ui/message?address=orders/$deadletterqueue&seq={sample}").status_code
        == 200
    )


def test_the_overview_draws_each_queues_last_day(
    open_client: TestClient, broker: Broker, dead: dict[str, list[int]], clock: ManualClock
) -> None:
    clock.advance(3600)
    broker.sender("orders").send([Message(body="x"), Message(body="y")])
    page = open_client.get("/ui/").text
    cell = re.search(r'<td class="trends">(.*?)</td>', page, re.S)
    assert cell, page
    # The hour the fixture dead-lettered in held 3 at once, though it ended empty: its bar
    # is the hour's highest depth (the depth at the hour's end drew it as 0, "at most 2").
    label = "highest depth each hour over the last 24 h: from 0 to 2, at most 3"
    assert label in cell.group(1)
    assert "6 dead-lettered in the last 24 h" in cell.group(1)
    assert len(re.findall(r"<rect class=\"dead\"", cell.group(1))) == 1


def test_the_form_searches_by_time_message_id_and_body(
    open_client: TestClient, broker: Broker, queue: str, clock: ManualClock
) -> None:
    receiver = broker.receiver(queue)
    for n in range(3):
        broker.sender(queue).send(Message(body=f"order {n} for cust-{n}", message_id=f"o-{n}"))
        receiver.dead_letter(receiver.receive(), "Invalid")
        clock.advance(3600)

    def matching(query: str) -> str:
        answer = open_client.get(f"/ui/deadletters?queue=orders&{query}")
        assert answer.status_code == 200, answer.text
        return re.search(r'<strong id="matching">(\d+)</strong>', answer.text)[1]  # type: ignore[index]

    assert matching("since=2023-11-14T22:13:20") == "3"  # the clock's start, 1_700_000_000
    assert matching("since=2023-11-14T23:13:20") == "2"
    assert matching("since=2023-11-14T23:13:20&until=2023-11-15T00:13:20") == "1"
    assert matching("message_id=o-2") == "1"
    assert matching("body_contains=cust-1") == "1"
    page = open_client.get("/ui/deadletters?queue=orders&since=2023-11-14T23:13:20").text
    assert 'name="since" value="2023-11-14T23:13:20"' in page
    assert "since=2023-11-14T23%3A13%3A20" in page  # the links carry it as typed
    bad = open_client.get("/ui/deadletters?queue=orders&since=yesterday")
    assert bad.status_code == 400
    assert (
        "since must be a time such as 2026-11-24T18:05 (UTC), not &#39;yesterday&#39;" in bad.text
    )
    backwards = "since=2023-11-15T00:13:20&until=2023-11-14T23:13:20"
    bad = open_client.get(f"/ui/deadletters?queue=orders&{backwards}")
    assert bad.status_code == 400
    assert "Nothing selected: until must be later than since" in bad.text
    assert 'name="until" value="2023-11-14T23:13:20"' in bad.text  # the form as it was typed
    api = open_client.get(f"/api/queues/orders/deadletters?{backwards}")
    assert api.status_code == 400
    assert api.json() == {
        "error": "InvalidOptionError",
        "detail": "until must be later than since (the range is empty)",
    }


def test_shapes() -> None:
    assert sparkline([0, 0, 0], width=10, height=4) == "0.0,3.0 5.0,3.0 10.0,3.0"
    assert sparkline([0, 2, 1], width=10, height=4) == "0.0,3.0 5.0,1.0 10.0,2.0"
    [one] = bars([0, 4, 0, 0], width=8, height=4)
    assert (one.x, one.y, one.height) == (2.0, 0.0, 4.0)
    chart = stacked(Timeline(0, 60, 2, {"a": [1, 0], "b": [1, 2], None: [0, 0]}))
    assert chart.peak == 2 and chart.total == 4
    assert [(r.css, r.y, r.height) for r in chart.rects] == [
        ("s0", HEIGHT / 2, HEIGHT / 2),
        ("s1", 0, HEIGHT / 2),
        ("s1", 0, HEIGHT),
    ]
    assert [label for _, label, _ in chart.legend] == ["a", "b", "(none)"]
    many = Timeline(0, 60, 1, {str(n): [1] for n in range(9)})
    legend = stacked(many).legend
    assert legend[-1] == ("s7", "other", 2)


def _lab(colour: str) -> tuple[float, float, float]:
    """CIELAB of an sRGB ``#rrggbb`` (D65)."""

    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(int(colour[i : i + 2], 16) / 255) for i in (1, 3, 5))
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(v: float) -> float:
        return v ** (1 / 3) if v > 0.008856 else 7.787 * v + 16 / 116

    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def test_the_seven_series_colours_are_told_apart() -> None:
    """With 7 reasons a teal and the green were both read as green (ΔE 23 apart): every
    two of the colours a chart gives its largest series are at least ΔE 30 apart (CIE76)."""
    css = (Path(charts.__file__).parent / "static" / "style.css").read_text()
    found = dict(re.findall(r"\.(s[0-6]) \{ --c: (#[0-9a-f]{6}); \}", css))
    assert sorted(found) == [f"s{n}" for n in range(charts.COLOURS)]
    for a, b in itertools.combinations(sorted(found), 2):
        distance = math.dist(_lab(found[a]), _lab(found[b]))
        assert distance >= 30, (a, found[a], b, found[b], round(distance))
    assert math.dist(_lab("#00796b"), _lab("#17703d")) < 30  # the pair it caught
