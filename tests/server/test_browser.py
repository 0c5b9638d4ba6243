"""The dead-letter explorer in a real headless Chromium (Debian's ``chromium`` package,
driven by Playwright; ``make test`` installs it with ``scripts/ensure-chromium``). The server
is uvicorn on 127.0.0.1 in a thread, on a real SQLite file."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, FrameLocator, Page, expect

from poisonq import Broker, ManualClock, Message
from poisonq.server import create_app
from poisonq.server.background import BackgroundServer
from tests.helpers import assert_balanced
from tests.server.conftest import MALICIOUS, TOKEN, GatedClock, record

pytestmark = pytest.mark.browser


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    yield opened
    context.close()


def log_in(page: Page, live: BackgroundServer) -> None:
    page.goto(f"{live.url}/ui/")
    expect(page).to_have_url(re.compile(r"/ui/login"))
    page.fill("input[name=operator]", "Ada Lovelace")
    page.fill("input[name=token]", TOKEN)
    page.click("#login")
    expect(page.locator("#queues")).to_be_visible()


def task_view(page: Page) -> Page | FrameLocator:
    """Where a task's page shows its status: the progress frame while the task ran when the
    page was made, else the page itself."""
    expect(page.locator("h1")).to_contain_text(" task ")
    return page.frame_locator("#task-frame") if page.locator("#task-frame").count() else page


def test_resubmit_from_the_explorer(
    page: Page, live: BackgroundServer, broker: Broker, dead: dict[str, list[int]]
) -> None:
    log_in(page, live)
    page.click("#queues a.dead")  # the dead-letter depth of orders
    expect(page.locator("#matching")).to_have_text("6")
    page.click("#groups >> text=MaxDeliveryCountExceeded")
    expect(page.locator("#matching")).to_have_text("3")
    page.click("#resubmit")
    expect(page.locator("#question")).to_contain_text("Send 3 dead-lettered message(s)")
    page.click("#confirm")
    expect(task_view(page).locator("#task-status")).to_have_text("completed")
    expect(task_view(page).locator("#task-progress")).to_have_text("3 of 3")
    page.click("text=Back to the dead letters of orders")
    expect(page.locator("#matching")).to_have_text("3")
    expect(page.locator("#groups")).not_to_contain_text("MaxDeliveryCountExceeded")
    moved = {m.message_id for m in broker.peek("orders", max_messages=10)}
    assert moved == {"o-0", "o-1", "o-2"}
    assert broker.counts("orders")["dead_lettered"] == 3
    assert_balanced(broker)


def test_purging_everything_asks_for_the_count(
    page: Page, live: BackgroundServer, broker: Broker, dead: dict[str, list[int]]
) -> None:
    log_in(page, live)
    page.goto(f"{live.url}/ui/deadletters?queue=orders")
    page.click("#purge")
    expect(page.locator("#question")).to_contain_text("Drop 6 dead-lettered message(s)")
    page.click("#confirm")  # the browser refuses the form: the count is required
    expect(page.locator("#question")).to_be_visible()
    page.fill("#count", "60")
    page.click("#confirm")
    expect(page.locator("#refused")).to_contain_text("60 is not the number")
    assert broker.counts("orders")["dead_lettered"] == 6
    page.fill("#count", "6")
    page.click("#confirm")
    expect(task_view(page).locator("#task-status")).to_have_text("completed")
    assert broker.counts("orders")["dead_lettered"] == 0


def test_a_malicious_body_renders_as_text_and_never_runs(
    page: Page, live: BackgroundServer, dead: dict[str, list[int]]
) -> None:
    log_in(page, live)
    page.goto(f"{live.url}/ui/deadletters?queue=orders&reason=InvalidOrder")
    expect(page.locator("#messages")).to_contain_text("<script>window.__pwned = true</script>")
    seq = dead["hostile"][0]
    page.click(f"#messages a:text-is('{seq}')")
    expect(page.locator("#body")).to_have_text(MALICIOUS)
    expect(page.locator("#properties")).to_contain_text(MALICIOUS)
    assert page.locator("#body script, #body img, #properties img").count() == 0
    assert page.evaluate("() => window.__pwned") is None
    assert page.evaluate("() => document.scripts.length") == 0


def test_the_policy_blocks_a_script_even_if_one_got_in(page: Page, live: BackgroundServer) -> None:
    """Defence in depth: were a script ever to reach a page, the CSP would stop it."""
    violations: list[str] = []
    page.on("console", lambda message: violations.append(message.text))
    page.goto(f"{live.url}/ui/login")
    page.evaluate(
        """() => { const s = document.createElement('script');
                   s.textContent = 'window.__pwned = true'; document.body.appendChild(s); }"""
    )
    assert page.evaluate("() => window.__pwned") is None
    assert any("Content Security Policy" in text for text in violations), violations


# Layout and access -----------------------------------------------------------------------
LONG_SUBJECT = "order.created." + "x" * 106  # 120 characters, no space to break at
LONG_NAME = "customer_reference_" * 16  # a 304-character property name


@pytest.fixture
def long_values(broker: Broker, dead: dict[str, list[int]]) -> int:
    """One more dead letter whose subject, id, reason, property name and failure (a JVM
    frame with no space to break at) are all too long to show whole; returns its sequence
    number."""
    [seq] = broker.sender("orders").send(
        Message(
            body="{}",
            subject=LONG_SUBJECT,
            message_id="m-" + "7" * 90,
            properties={LONG_NAME: "a value " * 30, "region": "eu"},
        )
    )
    receiver = broker.receiver("orders")
    frame = "org.apache.spark.api.python.BasePythonRunner$ReaderIterator$$anonfun$1" * 2
    receiver.dead_letter(
        receiver.receive(), "Reason" + "Long" * 30, "why " * 80, error=RuntimeError(frame)
    )
    return seq


def no_sideways_scroll(page: Page) -> None:
    scroll, width = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert scroll <= width, f"the page is {scroll} px wide in a {width} px viewport"


@pytest.mark.parametrize("width", [1280, 800, 390])
def test_long_values_wrap_whole_and_never_widen_a_page(
    page: Page, live: BackgroundServer, long_values: int, width: int
) -> None:
    """A value too long for its column wraps in it, shown whole (not cut with the rest only
    in a title no keyboard or phone shows); a table too wide scrolls in its own box."""
    page.set_viewport_size({"width": width, "height": 800})
    log_in(page, live)
    no_sideways_scroll(page)
    page.goto(f"{live.url}/ui/deadletters?queue=orders&by=subject")
    no_sideways_scroll(page)
    page.click(f"#groups td[title='{LONG_SUBJECT}'] a")  # selected: a chip with the subject
    expect(page.locator(".selection .chip")).to_have_attribute("title", f"subject={LONG_SUBJECT}")
    no_sideways_scroll(page)
    for table in ("#groups", "#messages"):
        cell = page.locator(f"{table} td[title='{LONG_SUBJECT}']")
        expect(cell).to_be_visible()
        expect(cell).to_contain_text(LONG_SUBJECT)
        assert cell.evaluate("td => td.scrollWidth <= td.clientWidth"), "cut"
    page.goto(f"{live.url}/ui/message?address=orders/$deadletterqueue&seq={long_values}")
    no_sideways_scroll(page)
    height = page.evaluate("() => document.documentElement.scrollHeight")
    assert height < 2500, f"the message page is {height} px tall"
    expect(page.locator("#properties")).to_contain_text("region")
    page.click("#resubmit")
    page.click("#confirm")
    expect(task_view(page).locator("#task-status")).to_have_text("completed")
    no_sideways_scroll(page)
    page.goto(f"{live.url}/ui/tasks")
    expect(page.locator("#tasks td[title='Ada Lovelace']")).to_be_visible()
    no_sideways_scroll(page)


def test_the_message_page_stacks_on_a_narrow_screen(
    page: Page, live: BackgroundServer, long_values: int
) -> None:
    log_in(page, live)
    sections = page.locator(".columns > section")
    for width, stacked in ((1280, False), (690, True)):
        page.set_viewport_size({"width": width, "height": 800})
        page.goto(f"{live.url}/ui/message?address=orders/$deadletterqueue&seq={long_values}")
        first, second = sections.nth(0).bounding_box(), sections.nth(1).bounding_box()
        assert first and second
        assert (second["y"] >= first["y"] + first["height"]) is stacked, width


def test_a_phone_sees_each_queues_dead_letters(
    page: Page, live: BackgroundServer, dead: dict[str, list[int]]
) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, live)
    no_sideways_scroll(page)
    header = page.locator("#queues th", has_text="dead-letter").first
    count = page.locator("#queues a.dead")
    for shown in (header, count):
        expect(shown).to_be_visible()
        box = shown.bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390
    expect(count).to_have_text("6")
    assert header.evaluate("th => th.scrollWidth <= th.clientWidth"), "the heading is cut"


CONTRAST = """el => {
  const rgb = s => s.match(/[\\d.]+/g).map(Number);
  const lum = ([r, g, b]) => {
    const f = c => (c /= 255) <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const ratio = (a, b) => {
    const [hi, lo] = [lum(a), lum(b)].sort((x, y) => y - x);
    return (hi + 0.05) / (lo + 0.05);
  };
  const background = node => {
    for (; node; node = node.parentElement) {
      const c = rgb(getComputedStyle(node).backgroundColor);
      if (c.length < 4 || c[3] > 0) return c.slice(0, 3);
    }
    return [255, 255, 255];
  };
  const style = getComputedStyle(el);
  return {
    text: ratio(rgb(style.color).slice(0, 3), background(el)),
    border: ratio(rgb(style.borderTopColor).slice(0, 3), background(el.parentElement)),
  };
}"""


def contrast(page: Page, selector: str) -> list[dict[str, float]]:
    found = page.locator(selector)
    assert found.count(), f"nothing matches {selector}"
    return [found.nth(n).evaluate(CONTRAST) for n in range(found.count())]


def test_text_pills_labels_and_fields_meet_wcag_aa(
    page: Page, live: BackgroundServer, broker: Broker, dead: dict[str, list[int]]
) -> None:
    broker.disable("orders")
    log_in(page, live)
    text = ["#queues .status", ".card .label", "#operator", ".bar nav a", "#queues th"]
    checks = [("/ui/", text, [])]
    text = [".filters label", ".tabs a", ".chip", "#groups td", ".crumbs", ".muted", "a.button"]
    checks.append(("/ui/deadletters?queue=orders&reason=InvalidOrder", text, [".filters input"]))
    checks.append(("/ui/login", ["label"], ["input[name=operator]"]))
    for path, texts, fields in checks:
        page.goto(live.url + path)
        for selector in texts:
            for measured in contrast(page, selector):
                assert measured["text"] >= 4.5, (path, selector, measured)
        for selector in fields:
            for measured in contrast(page, selector):
                assert measured["border"] >= 3, (path, selector, measured)
    broker.enable("orders")
    page.goto(f"{live.url}/ui/deadletters?queue=orders")
    page.click("#resubmit")
    page.click("#confirm")
    expect(task_view(page).locator("#task-status")).to_have_text("completed")
    page.reload()  # the finished task's status in the page itself
    for measured in contrast(page, "#task-status"):
        assert measured["text"] >= 4.5, measured


def test_a_skip_link_leads_past_the_header(page: Page, live: BackgroundServer, queue: str) -> None:
    log_in(page, live)
    page.keyboard.press("Tab")
    skip = page.locator("a.skip")
    expect(skip).to_be_focused()
    box = skip.bounding_box()
    assert box and box["y"] >= 0, "the focused skip link is off screen"
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()


def test_a_failed_login_is_announced_and_keeps_the_name(page: Page, live: BackgroundServer) -> None:
    page.goto(f"{live.url}/ui/login")
    page.fill("input[name=operator]", "Ada Lovelace")
    page.fill("input[name=token]", "a guess")
    page.click("#login")
    expect(page.get_by_role("alert")).to_have_text("That is not the token.")
    expect(page.locator("input[name=operator]")).to_have_value("Ada Lovelace")
    expect(page.locator("input[name=token]")).to_be_focused()


def test_a_running_tasks_progress_reloads_without_moving_the_keyboard(
    page: Page, gated: tuple[Broker, GatedClock]
) -> None:
    """The progress is a frame that reloads itself; the page around it, with Cancel, does
    not reload, so the keyboard stays where it was put (a meta refresh of the whole page
    sent it back to the top every 2 s)."""
    broker, clock = gated
    task = broker.resubmit("orders", rate=5, wait=False)
    try:
        assert clock.sleeping.wait(10)
        with BackgroundServer(create_app(broker, token=TOKEN)) as server:
            violations: list[str] = []
            page.on("console", lambda message: violations.append(message.text))
            log_in(page, server)
            page.goto(f"{server.url}/ui/tasks/{task.id}?queue=orders")
            progress = page.frame_locator("#task-frame")
            bar = progress.get_by_role("progressbar", name=re.compile("Progress: 1 of 10"))
            expect(bar).to_be_visible()
            page.locator("#cancel").focus()
            page.keyboard.press("Tab")  # on to the next control: Stop reloading
            expect(page.locator("#stop-reloading")).to_be_focused()
            loads: list[str] = []
            page.on("load", lambda loaded: loads.append(loaded.url))
            for _ in range(2):  # the frame reloads itself ...
                with page.expect_event("framenavigated", lambda f: f.parent_frame is not None):
                    pass
            assert loads == []  # ... the page does not
            expect(page.locator("#stop-reloading")).to_be_focused()
            page.keyboard.press("Shift+Tab")
            expect(page.locator("#cancel")).to_be_focused()
            page.keyboard.press("Enter")
            expect(page.locator("#task-status")).to_have_text("cancelled")  # in the page now
            assert page.locator("#task-frame").count() == 0
            assert not [v for v in violations if "Content Security Policy" in v], violations
    finally:
        clock.go.set()
        task.wait(10)


def test_a_task_page_can_stop_reloading(page: Page, gated: tuple[Broker, GatedClock]) -> None:
    broker, clock = gated
    task = broker.resubmit("orders", rate=5, wait=False)
    try:
        assert clock.sleeping.wait(10)
        with BackgroundServer(create_app(broker, token=TOKEN)) as server:
            log_in(page, server)
            page.goto(f"{server.url}/ui/tasks/{task.id}?queue=orders")
            page.click("#stop-reloading")
            expect(page.locator("#task-progress")).to_have_text("1 of 10")  # still, in the page
            assert page.locator("#task-frame, meta[http-equiv=refresh]").count() == 0
            page.click("#follow")
            expect(page.frame_locator("#task-frame").locator("#task-status")).to_have_text(
                "running"
            )
    finally:
        clock.go.set()
        task.wait(10)


@pytest.mark.parametrize("width", [1280, 390])
def test_a_pipeline_timeline_draws_under_the_policy_on_any_screen(
    page: Page, live: BackgroundServer, broker: Broker, clock: ManualClock, width: int
) -> None:
    broker.create_queue("orders")
    record(broker, clock, "orders", "nightly", [5, 8, 3])
    console: list[str] = []
    page.on("console", lambda message: console.append(message.text))
    page.set_viewport_size({"width": width, "height": 800})
    log_in(page, live)
    page.click("#pipelines-card")
    page.click("#pipelines a:text-is('nightly')")
    chart = page.locator("#timeline")
    expect(chart).to_be_visible()
    expect(page.locator("#timeline .batch")).to_have_count(3)
    box = chart.bounding_box()
    assert box and box["width"] >= 800 and box["height"] > 50  # never shrunk below its size
    frame = page.locator("figure.timeline").bounding_box()
    assert frame and frame["width"] <= width  # on a phone it scrolls in its box
    dead = page.locator("#timeline rect.dead").first.bounding_box()
    assert dead and dead["height"] >= 1  # the dead letter of batch 2 shows
    no_sideways_scroll(page)
    assert not [text for text in console if "Content Security Policy" in text], console


# Charts ------------------------------------------------------------------------------------
SERIES_CONTRAST = """el => {
  const lum = s => {
    const f = c => (c /= 255) <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
    const [r, g, b] = s.match(/[\\d.]+/g).map(Number);
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  return 1.05 / (lum(getComputedStyle(el).fill) + 0.05);
}"""


def test_the_chart_draws_under_the_policy_and_its_window_is_a_link(
    page: Page, live: BackgroundServer, dead: dict[str, list[int]]
) -> None:
    violations: list[str] = []
    page.on("console", lambda message: violations.append(message.text))
    log_in(page, live)
    page.click("#queues a.dead")
    bars = page.locator("#chart svg rect")
    expect(bars).to_have_count(2)  # one bar, two reasons stacked
    box = page.locator("#chart svg").bounding_box()
    assert box and box["width"] > 600 and box["height"] > 100
    for n in range(2):  # coloured by their class (an inline style would be refused)
        assert bars.nth(n).evaluate(SERIES_CONTRAST) >= 3, "a series fades into the page"
    assert "InvalidOrder: 3" in bars.nth(0).locator("title").text_content()  # type: ignore[operator]
    expect(page.locator("#chart figcaption")).to_contain_text("MaxDeliveryCountExceeded 3")
    expect(page.locator("#groups polyline")).to_have_count(2)
    page.click("#windows >> text=hour")
    expect(page.locator("#trend-title")).to_have_text("Dead-lettered over the last hour, by reason")
    expect(page).to_have_url(re.compile(r"window=hour"))
    page.click("#groups >> text=MaxDeliveryCountExceeded")  # the selection keeps the window
    expect(page).to_have_url(re.compile(r"window=hour"))
    expect(page.locator("#matching")).to_have_text("3")
    page.click("#groups tr.on .causes a")  # a sample of the cause the reason hides
    expect(page.locator("h1")).to_contain_text(f"Message {dead['MaxDeliveryCountExceeded'][0]}")
    assert not [v for v in violations if "Content Security Policy" in v], violations


def test_the_overview_draws_each_queues_day(
    page: Page, live: BackgroundServer, dead: dict[str, list[int]]
) -> None:
    log_in(page, live)
    cell = page.locator("#queues .trends").first
    expect(cell.locator("svg")).to_have_count(2)
    expect(cell.locator("rect.dead")).to_have_count(1)
    assert cell.locator("polyline").evaluate("p => getComputedStyle(p).fill") == "none"


def test_a_message_with_many_properties_keeps_them_in_a_box_that_scrolls(
    page: Page, live: BackgroundServer, broker: Broker, queue: str
) -> None:
    properties = {f"attribute_{n:03}": "value " * 4 for n in range(300)}
    [seq] = broker.sender(queue).send(Message(body="{}", properties=properties))
    receiver = broker.receiver(queue)
    receiver.dead_letter(receiver.receive(), "Invalid")
    log_in(page, live)
    page.goto(f"{live.url}/ui/message?address={queue}/$deadletterqueue&seq={seq}")
    expect(page.locator("#properties-count")).to_have_text("300")
    box = page.locator("#properties-box")
    height = box.evaluate("b => b.clientHeight")
    assert 100 < height <= 360
    assert box.evaluate("b => b.scrollHeight > b.clientHeight"), "nothing left to scroll to"
    page_height = page.evaluate("() => document.documentElement.scrollHeight")
    assert page_height < 1600, f"the message page is {page_height} px tall"
    box.focus()  # the keyboard reaches the box and scrolls it
    page.keyboard.press("End")
    expect(box.locator("th", has_text="attribute_299")).to_be_in_viewport()


def test_the_pipeline_pages_fit_a_phone(
    page: Page, live: BackgroundServer, broker: Broker, clock: ManualClock
) -> None:
    """At 390 px: the list of consumers, a consumer's chart and batches, and the overview's
    cards, with names long enough to push, never widen the page; the chart keeps its tick
    labels readable (11 px) and scrolls in its box to show them all."""
    queue = "orders.incoming." + "eu-west-" * 4
    broker.create_queue(queue)
    consumer = "nightly-reconciliation-" + "x" * 40
    record(broker, clock, queue, consumer, [5, 8000, 3, 120000])
    page.set_viewport_size({"width": 390, "height": 800})
    log_in(page, live)
    no_sideways_scroll(page)  # the overview, its cards
    page.click("#pipelines-card")
    expect(page.locator("#pipelines")).to_be_visible()
    no_sideways_scroll(page)
    page.click(f"#pipelines a:text-is('{consumer}')")
    expect(page.locator("#timeline .batch")).to_have_count(4)
    no_sideways_scroll(page)
    frame = page.locator("figure.timeline")
    left, inside = frame.evaluate("f => [f.getBoundingClientRect().left, f.scrollWidth]")
    for label in page.locator("#timeline text").all():
        box = label.bounding_box()
        assert box and box["height"] >= 11, label.text_content()
        assert box["x"] >= left and box["x"] + box["width"] <= left + inside, label.text_content()
