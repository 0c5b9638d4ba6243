"""The dead-letter explorer in a real headless Chromium (Debian's ``chromium`` package,
driven by Playwright; ``make test`` installs it with ``scripts/ensure-chromium``). The server
is uvicorn on 127.0.0.1 in a thread, on a real SQLite file."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from poisonq import Broker
from poisonq.server.background import BackgroundServer
from tests.conftest import assert_balanced
from tests.server.chromium import launch
from tests.server.conftest import MALICIOUS, TOKEN

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        opened = launch(playwright)
        yield opened
        opened.close()


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
    expect(page.locator("#task-status")).to_have_text("completed")
    expect(page.locator("#task-progress")).to_have_text("3 of 3")
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
    expect(page.locator("#task-status")).to_have_text("completed")
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
