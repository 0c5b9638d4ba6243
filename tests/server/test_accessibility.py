"""Every page state of the web UI in a real Chromium, checked by axe-core against WCAG 2.1 A
and AA (tests/server/axe.py), at a desktop width, at 200 % zoom of it, on a phone and at
320 CSS px (WCAG 1.4.10, reflow): the page never scrolls sideways, and nothing a wide screen
shows is hidden on a narrow one. Each state is photographed at 1280 and 390 px into
``$POISONQ_SCREENSHOTS`` (else the test's temporary directory), to be looked at."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Route, expect

from poisonq import Broker, ManualClock
from poisonq.server import create_app
from poisonq.server.background import BackgroundServer
from tests.helpers import assert_balanced
from tests.server.axe import assert_accessible
from tests.server.conftest import TOKEN, GatedClock, record, wait_for_task

pytestmark = pytest.mark.browser

# (width, zoom): a laptop, the laptop at 200 %, a phone, and 1280 px at 400 % (320 CSS px).
SCREENS = [(1280, 1), (1280, 2), (390, 1), (1280, 4)]
HIDDEN = """() => [...document.querySelectorAll('main *')]
  .filter(el => getComputedStyle(el).display === 'none').length"""


def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("POISONQ_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def open_page(browser: Browser, width: int, zoom: int) -> Page:
    """A page as a browser zoomed to ``zoom`` on a ``width`` px window shows it: the CSS
    viewport shrinks by the zoom, the pixels do not."""
    context = browser.new_context(
        viewport={"width": width // zoom, "height": 900 // zoom}, device_scale_factor=zoom
    )
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    return opened


def log_in(page: Page, url: str) -> None:
    page.goto(f"{url}/ui/login")
    page.fill("input[name=operator]", "Ada Lovelace")
    page.fill("input[name=token]", TOKEN)
    page.click("#login")
    expect(page.locator("h1")).to_have_text("Queues")


def check(
    page: Page, name: str, folder: Path, width: int, zoom: int, hidden: dict[str, int]
) -> None:
    """axe finds nothing, the page keeps to the screen, it hides no more than at full width;
    photographed at 1280 and 390 px."""
    assert_accessible(page)
    scroll, shown = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert scroll <= shown, f"{name}: the page is {scroll} px wide in a {shown} px viewport"
    count = page.evaluate(HIDDEN)
    assert count <= hidden.setdefault(name, count), f"{name}: {count} elements hidden"
    if zoom == 1 or zoom == 2:
        page.screenshot(path=folder / f"{name}-{width // zoom}px-x{zoom}.png", full_page=True)


def a_count_fits_its_card(page: Page) -> None:
    """A card shows a seven-digit count whole (it cut "800716" to "80071" on a phone): the
    card's number is set to one, as a store with that many would show it."""
    cut = page.evaluate(
        """() => [...document.querySelectorAll('.card .num')].filter(num => {
             num.textContent = '1,800,716';
             const card = num.parentElement.getBoundingClientRect();
             return num.scrollWidth > num.clientWidth
                 || num.getBoundingClientRect().right > card.right;
           }).length"""
    )
    assert cut == 0


def _luminance(rgb: str) -> float:
    def linear(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(float(n)) for n in re.findall(r"[\d.]+", rgb)[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def the_headers_focus_ring_shows(page: Page) -> None:
    """The page's blue ring was 2.77:1 on the dark header: a ring keeps 3:1 (WCAG 1.4.11)."""
    page.locator("main").focus()
    page.keyboard.press("Shift+Tab")  # back into the header, by the keyboard
    style, ring, bar = page.evaluate(
        """() => [getComputedStyle(document.activeElement).outlineStyle,
                  getComputedStyle(document.activeElement).outlineColor,
                  getComputedStyle(document.querySelector('.bar')).backgroundColor]"""
    )
    assert page.evaluate("() => document.activeElement.closest('.bar') !== null")
    assert style == "solid"
    lighter, darker = sorted((_luminance(ring), _luminance(bar)), reverse=True)
    assert (lighter + 0.05) / (darker + 0.05) >= 3, (ring, bar)


@pytest.fixture
def seen(
    broker: Broker, clock: ManualClock, dead: dict[str, list[int]]
) -> Iterator[tuple[Broker, dict[str, list[int]]]]:
    """The dead letters of ``orders``, a pipeline's batches and a finished resubmit."""
    record(broker, clock, "orders", "nightly", [5, 8, 3])
    yield broker, dead
    assert_balanced(broker)


@pytest.mark.parametrize(("width", "zoom"), SCREENS)
def test_every_page_passes_axe_and_reflows(
    browser: Browser,
    app: object,
    seen: tuple[Broker, dict[str, list[int]]],
    tmp_path: Path,
    width: int,
    zoom: int,
) -> None:
    broker, dead = seen
    folder = shots(tmp_path)
    hidden: dict[str, int] = {}
    with BackgroundServer(app) as live:  # type: ignore[arg-type]
        for screen, times in ((1280, 1), (width, zoom)):
            page = open_page(browser, screen, times)
            page.goto(f"{live.url}/ui/login")
            check(page, "login", folder, screen, times, hidden)
            log_in(page, live.url)
            invalid = dead["InvalidOrder"][0]
            states = {
                "overview": "/ui/",
                "by-reason": "/ui/deadletters?queue=orders",
                "by-subject": "/ui/deadletters?queue=orders&by=subject",
                "by-fingerprint": "/ui/deadletters?queue=orders&by=fingerprint",
                "group": "/ui/deadletters?queue=orders&reason=InvalidOrder",
                "message": f"/ui/message?address=orders/$deadletterqueue&seq={invalid}",
                "pipelines": "/ui/pipelines",
                "pipeline": "/ui/pipeline?consumer=nightly&queue=orders",
                "audit": "/ui/audit",
                "not-found": "/ui/deadletters?queue=nowhere",
                "tasks-empty": "/ui/tasks",
                "invalid": "/ui/deadletters?queue=orders&min_sequence=x",
            }
            for name, path in states.items():
                answer = page.goto(live.url + path)
                assert answer and answer.ok is (name not in ("not-found", "invalid")), name
                check(page, name, folder, screen, times, hidden)
                if name == "overview":
                    a_count_fits_its_card(page)
                    the_headers_focus_ring_shows(page)
            page.goto(f"{live.url}/ui/deadletters?queue=orders")
            page.click("#purge")  # all of them: the count must be typed
            expect(page.locator("#count")).to_be_visible()  # the confirm page, loaded
            check(page, "confirm", folder, screen, times, hidden)
            page.fill("#count", "99")
            page.click("#confirm")
            expect(page.locator("#refused")).to_be_visible()
            check(page, "refused", folder, screen, times, hidden)

            page.context.close()
    del broker


def without_refresh(route: Route) -> None:
    """The progress frame as served, less its ``Refresh`` header: axe and the keyboard must
    not race a reload here (test_browser.py proves the reloading)."""
    answer = route.fetch()
    headers = {k: v for k, v in answer.headers.items() if k.lower() != "refresh"}
    route.fulfill(response=answer, headers=headers)


@pytest.mark.parametrize(("width", "zoom"), SCREENS)
def test_tasks_and_a_running_task_pass_axe_and_reflow(
    browser: Browser, gated: tuple[Broker, GatedClock], tmp_path: Path, width: int, zoom: int
) -> None:
    broker, clock = gated
    folder = shots(tmp_path)
    hidden: dict[str, int] = {}
    task = broker.resubmit("orders", rate=5, wait=False)
    app = create_app(broker, token=TOKEN)
    try:
        assert clock.sleeping.wait(10)
        with BackgroundServer(app) as live:
            for screen, times in ((1280, 1), (width, zoom)):
                page = open_page(browser, screen, times)
                log_in(page, live.url)
                page.route("**/ui/tasks/*/progress?*", without_refresh)
                page.goto(f"{live.url}/ui/tasks/{task.id}?queue=orders")
                expect(page.frame_locator("#task-frame").locator("#task-status")).to_have_text(
                    "running"
                )
                check(page, "task-running", folder, screen, times, hidden)
                page.locator("#stop-reloading").focus()
                page.keyboard.press("Tab")  # into the frame: its progress shows the focus
                region = page.frame_locator("#task-frame").locator("#progress-region")
                expect(region).to_be_focused()
                assert region.evaluate("el => getComputedStyle(el).outlineStyle") == "solid"
                page.goto(f"{live.url}/ui/tasks")
                check(page, "tasks", folder, screen, times, hidden)
                page.context.close()
    finally:
        clock.go.set()
        wait_for_task(app, task.id)  # before the broker closes under it
