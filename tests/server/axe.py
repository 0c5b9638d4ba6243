"""axe-core in the browser tests: every page state they reach is checked against the WCAG 2.1
A and AA rules. ``scripts/ensure-axe`` (run by ``make test``) brings axe.min.js from the npm
registry into ``.cache/axe-core/``; a missing copy fails the test, it is never skipped."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from playwright.sync_api import Page

VERSION = "4.14.1"
SOURCE = Path(__file__).resolve().parents[2] / ".cache" / "axe-core" / VERSION / "axe.min.js"
TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]


@cache
def _source() -> str:
    if not SOURCE.exists():
        raise RuntimeError(f"no {SOURCE}: run scripts/ensure-axe (make test does)")
    return SOURCE.read_text()


def violations(page: Page) -> list[str]:
    """What axe finds on the page as it is now (its frames included), one line a node."""
    for frame in page.frames:  # evaluated through the debugger: the page's CSP does not apply
        frame.evaluate(_source())
    found = page.evaluate(
        "tags => axe.run(document, {runOnly: {type: 'tag', values: tags}})"
        ".then(r => r.violations.map(v => ({id: v.id, help: v.help,"
        " nodes: v.nodes.map(n => n.target.join(' ') + ' ' + n.failureSummary)})))",
        TAGS,
    )
    return [f"{v['id']} ({v['help']}): {node}" for v in found for node in v["nodes"]]


def assert_accessible(page: Page) -> None:
    found = violations(page)
    assert not found, json.dumps(found, indent=1)
