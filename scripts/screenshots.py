"""Screenshots of the web UI for docs/http.md: a demo store with realistic dead-letters,
served in this process and photographed in Debian's Chromium.

    .venv/bin/python scripts/screenshots.py        # writes docs/*.png
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for tests.server.chromium, shared with the browser tests

from playwright.sync_api import sync_playwright  # noqa: E402

import poisonq  # noqa: E402
from poisonq import Abandon, BatchRun, Broker, DeadLetter, ManualClock, Message  # noqa: E402
from poisonq.server import create_app  # noqa: E402
from poisonq.server.background import BackgroundServer  # noqa: E402
from tests.server.chromium import launch  # noqa: E402

TOKEN = "screenshots"
ROUNDS = 12  # the feed arrives over the last day in this many rounds, for the charts
CUSTOMERS = {f"cust-{n}" for n in range(1, 40)}


class UpstreamTimeout(Exception):
    """The payment provider did not answer."""


def find_customer(order: dict[str, object]) -> None:
    if order["customer"] not in CUSTOMERS:
        raise KeyError(order["customer"])


def check_amount(order: dict[str, object]) -> None:
    amount = float(order["amount"])  # type: ignore[arg-type]
    if amount <= 0:
        raise ValueError(f"amount must be positive, got {amount}")


def charge(order: dict[str, object]) -> None:
    raise UpstreamTimeout(f"payments.example did not answer in 30 s (order {order['id']})")


def handle(message: poisonq.ReceivedMessage) -> None:
    order = json.loads(message.body)
    find_customer(order)
    check_amount(order)
    if order.get("card") == "declined":
        charge(order)


def fill(broker: Broker, clock: ManualClock) -> None:
    """Orders, payments and invoices, with the failures a real feed has, arriving in rounds
    over the last day (``clock`` starts a day ago and ends now)."""
    rng = random.Random(7)
    broker.create_queue("orders", max_delivery_count=3, lock_duration=30)
    broker.create_queue("payments", max_delivery_count=5)
    broker.create_queue("invoices", default_message_ttl=0.01)
    broker.create_queue("shipping/labels")
    orders = []
    for n in range(1, 161):
        order = {
            "id": f"PO-{20000 + n}",
            "customer": rng.choice(sorted(CUSTOMERS)) if n % 9 else f"cust-{700 + n}",
            "amount": round(rng.uniform(5, 900), 2) if n % 13 else -rng.randint(1, 50),
            "card": "declined" if n % 17 == 0 else "ok",
            "lines": [{"sku": f"SKU-{rng.randint(100, 999)}", "qty": rng.randint(1, 4)}],
        }
        orders.append(
            Message(
                body=json.dumps(order),
                subject="order.created",
                message_id=order["id"],
                properties={"region": rng.choice(["eu", "us"])},
            )
        )
    orders.append(
        Message(
            body="<order id=PO-9 total=12.50/>",
            subject="order.created",
            content_type="application/xml",
        )
    )
    rng.shuffle(orders)
    step = (time.time() - clock.now()) / ROUNDS
    for round_ in range(ROUNDS):
        broker.sender("orders").send(orders[round_::ROUNDS])
        poisonq.Processor(
            broker,
            "orders",
            handle,
            batch_size=50,
            permanent=(KeyError, ValueError, json.JSONDecodeError),
        ).run(until_idle=True)
        # payments: some still waiting, some dead-lettered by the application.
        broker.sender("payments").send(
            [Message(body=json.dumps({"payment": n}), subject="payment.captured") for n in range(4)]
        )
        receiver = broker.receiver("payments")
        for message in receiver.receive(max_messages=rng.randint(1, 3)):
            if message.sequence_number % 3 == 0:
                receiver.dead_letter(message, "FraudSuspected", "risk score 0.97 over 0.90")
            else:
                receiver.complete(message)
        clock.advance(step * rng.uniform(0.6, 1.0))
    broker.sender("invoices").send(
        [Message(body=f"invoice {n}", subject="invoice") for n in range(6)]
    )
    broker.clock.sleep(0.05)
    broker.receiver("invoices").receive(max_messages=1)  # the expired ones are dead-lettered
    broker.sender("shipping/labels").send([Message(body="label", subject="label")] * 7)
    clock.advance(time.time() - clock.now())


def run_pipeline(broker: Broker, clock: ManualClock) -> None:
    """A pipeline's timeline: batches of orders leased, handled and settled as the Spark
    runner does, each taking its time on the demo's clock (without Spark, to stay quick)."""
    rng = random.Random(11)
    broker.create_queue("orders-feed", max_delivery_count=2)
    for number in range(1, 25):
        size = rng.randint(150, 400)
        body = [{"id": n, "amount": rng.uniform(-5, 900)} for n in range(size)]
        broker.sender("orders-feed").send([Message(body=json.dumps(b)) for b in body])
        lease = broker.acquire_lease("orders-feed", "nightly", number, max_messages=size)
        assert lease is not None
        started = clock.now()
        failed: list[Abandon | DeadLetter] = []
        for seq, _, raw, *_ in broker.lease_rows(lease):
            order = json.loads(raw)
            if order["amount"] <= 0:
                failed.append(DeadLetter(seq, lease.lock_token, "InvalidAmount", None))
            elif rng.random() < 0.01:
                failed.append(Abandon(seq, lease.lock_token))
        work = rng.uniform(0.5, 2.0) * (3 if number == 17 else 1)
        clock.advance(work / 2)
        broker.settle_held("orders-feed", failed)
        clock.advance(work / 2)
        broker.complete_lease(lease, BatchRun(started, clock.now() - started))
        clock.advance(5.0)  # until the next batch


def main() -> None:
    docs = ROOT / "docs"
    docs.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        clock = ManualClock(time.time() - 24 * 3600)
        broker = poisonq.connect(f"sqlite:///{folder}/demo.db", clock=clock)
        fill(broker, clock)
        run_pipeline(broker, clock)
        with BackgroundServer(create_app(broker, token=TOKEN)) as server, sync_playwright() as pw:
            browser = launch(pw)
            page = browser.new_page(viewport={"width": 1360, "height": 760}, device_scale_factor=1)
            page.goto(f"{server.url}/ui/login")
            page.fill("input[name=operator]", "Ada Lovelace")
            page.fill("input[name=token]", TOKEN)
            page.click("#login")
            page.screenshot(path=docs / "overview.png", full_page=True)
            page.goto(f"{server.url}/ui/deadletters?queue=orders")
            page.click("#groups >> text=MaxDeliveryCountExceeded")
            page.screenshot(path=docs / "explorer.png", full_page=True)
            page.goto(f"{server.url}/ui/deadletters?queue=orders&reason=MaxDeliveryCountExceeded")
            page.click("#messages a >> nth=0")
            page.screenshot(path=docs / "message.png", full_page=True)
            page.goto(f"{server.url}/ui/pipeline?consumer=nightly")
            page.screenshot(path=docs / "pipeline.png")
            page.goto(f"{server.url}/ui/audit")
            page.screenshot(path=docs / "audit.png")
            page.set_viewport_size({"width": 390, "height": 844})  # a phone: nothing hidden
            page.goto(f"{server.url}/ui/deadletters?queue=orders")
            page.screenshot(path=docs / "explorer-phone.png")
            browser.close()
        broker.close()
    print("wrote", ", ".join(str(p.relative_to(ROOT)) for p in sorted(docs.glob("*.png"))))


if __name__ == "__main__":
    main()
