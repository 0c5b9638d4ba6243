"""The pipelines' pages of the web UI on both stores: the list of consumers with a timeline,
linked from every page, and a consumer's page with its timeline as an SVG chart (no script,
no inline style: the CSP allows neither) and its batches."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from poisonq import Broker, ManualClock
from tests.server.conftest import MALICIOUS, record


def test_the_overview_links_the_pipelines_page(
    open_client: TestClient, broker: Broker, clock: ManualClock, queue: str
) -> None:
    empty = open_client.get("/ui/pipelines")
    assert empty.status_code == 200 and "No pipeline has completed a batch yet" in empty.text
    record(broker, clock, queue, "nightly", [3, 5])
    overview = open_client.get("/ui/").text
    assert 'href="/ui/pipelines"' in overview
    assert re.search(r'id="pipelines-card".*?<div class="num">1</div>', overview, re.S)
    listing = open_client.get("/ui/pipelines").text
    row = re.search(r"<tbody>(.*?)</tbody>", listing, re.S)
    assert row is not None
    assert 'href="/ui/pipeline?consumer=nightly&amp;queue=orders"' in row.group(1)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    numbers = [c for c in cells if c.replace(".", "", 1).isdigit()]
    assert numbers == ["2", "2", "2.00", "5", "2.5"]  # batches, lease, seconds, size, rate


def test_a_pipeline_page_draws_its_timeline_as_svg(
    open_client: TestClient, broker: Broker, clock: ManualClock, queue: str
) -> None:
    record(broker, clock, queue, "nightly", [4, 4, 2])
    answer = open_client.get("/ui/pipeline", params={"consumer": "nightly"})
    assert answer.status_code == 200
    assert "script-src 'none'" in answer.headers["content-security-policy"]
    html = answer.text
    svg = re.search(r'<svg id="timeline".*?</svg>', html, re.S)
    assert svg is not None
    chart = svg.group(0)
    assert "<script" not in html and "style=" not in chart
    bars = re.findall(r'<g class="batch">(.*?)</g>', chart, re.S)
    assert len(bars) == 3
    heights = [sum(float(h) for h in re.findall(r'height="([\d.]+)"', bar)) for bar in bars]
    assert heights[0] < heights[1] < heights[2]  # 1, 2 and 3 seconds
    assert heights[2] == 240 - 12 - 28  # the longest fills the plot
    assert 'class="dead"' in bars[1] and 'class="dead"' not in bars[0]
    assert "lease 2: 2.00 s, 4 messages (2/s): 3 completed, 0 retried, 1 dead-lettered" in bars[1]
    # The dead-letter reason is untrusted: escaped in the tooltip and the table.
    assert MALICIOUS not in html and "&lt;script&gt;" in html
    rows = re.findall(r"<tr>\s*<td class=\"n\">(\d+)</td>", html)
    assert rows == ["3", "2", "1"]  # newest first


def test_an_unknown_pipeline_is_a_404_page(
    open_client: TestClient, broker: Broker, clock: ManualClock, queue: str
) -> None:
    record(broker, clock, queue, "nightly", [1])
    answer = open_client.get("/ui/pipeline", params={"consumer": "nightlly"})
    assert answer.status_code == 404
    assert (
        "did you mean &#39;nightly&#39;?" in answer.text and "PipelineNotFoundError" in answer.text
    )


def test_pipeline_pages_need_a_login_when_reads_are_closed(client: TestClient, queue: str) -> None:
    for path in ("/ui/pipelines", "/ui/pipeline?consumer=x"):
        assert client.get(path, follow_redirects=False).status_code == 303
