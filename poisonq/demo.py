"""The end-to-end demo behind ``poisonq demo`` (and ``make demo``).

It sends purchase orders to a fresh SQLite queue, a few of them bad in each way a real feed
is bad, processes them with a :class:`~poisonq.processor.Processor`, and then proves the
promise of the library: every order was completed exactly once or is in the dead-letter queue
with the reason its failure deserves, nothing is missing, and the ledger balances.

| kind      | share | what the handler does                        | expected end              |
|-----------|-------|----------------------------------------------|---------------------------|
| good      | rest  | books it                                     | completed once            |
| invalid   | 1 %   | unknown customer: raises a PermanentError    | dead-lettered at once     |
| flaky     | 2 %   | warehouse times out on the first attempt     | completed once (attempt 2)|
| broken    | 0.5 % | warehouse is offline on every attempt        | MaxDeliveryCountExceeded  |
| expiring  | 0.5 % | sent with a 1 ms time to live                | TTLExpiredException       |
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from poisonq.client import Broker, connect
from poisonq.errors import PermanentError
from poisonq.model import LIVE_STATES, DeadLetterReason, Message, ReceivedMessage
from poisonq.processor import Processor, ProcessorStats

QUEUE = "orders"
DLQ = f"{QUEUE}/$deadletterqueue"
SEND_BATCH = 500
PAGE = 1000
CUSTOMERS = 500
SHARES = {"invalid": 0.01, "flaky": 0.02, "broken": 0.005, "expiring": 0.005}
EXPIRING_TTL = 0.001
# How a kind of bad order shows in its body: the handler (or a Spark transform) fails by it.
WAREHOUSES = {"flaky": "east", "broken": "west", "crash": "north"}


class UnknownCustomerError(PermanentError):
    """The order names a customer we do not have: retrying can never help."""


EXPECTED_REASON = {
    "invalid": UnknownCustomerError.__name__,
    "broken": DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED.value,
    "expiring": DeadLetterReason.TTL_EXPIRED.value,
}


@dataclass(frozen=True, slots=True)
class Order:
    """One generated order and how it is meant to misbehave."""

    order_id: str
    kind: str

    def message(self, rng: random.Random, encode: Encoder | None = None) -> Message:
        """The order as a message; ``encode`` (the order and its fields to the body) lets a
        demo send its bad orders bad in its own ways, JSON of the fields by default."""
        customer = f"cust-{rng.randrange(CUSTOMERS)}"
        if self.kind == "invalid":
            customer = f"cust-unknown-{rng.randrange(10**6)}"
        warehouse = WAREHOUSES.get(self.kind, "main")
        body = {
            "order_id": self.order_id,
            "customer": customer,
            "warehouse": warehouse,
            "items": [
                {"sku": f"sku-{rng.randrange(1000)}", "quantity": rng.randint(1, 5)}
                for _ in range(rng.randint(1, 3))
            ],
            "total": round(rng.uniform(5, 500), 2),
        }
        return Message(
            body=encode(self, body) if encode else json.dumps(body).encode(),
            message_id=self.order_id,
            subject="purchase-order",
            content_type="application/json",
            properties={"warehouse": warehouse},
            time_to_live=EXPIRING_TTL if self.kind == "expiring" else None,
        )


Encoder = Callable[[Order, dict[str, Any]], bytes]


def make_orders(count: int, rng: random.Random, shares: dict[str, float] = SHARES) -> list[Order]:
    """``count`` orders with the bad kinds mixed in, in random positions. A share below 1 is
    a fraction of ``count`` (at least one order, so that a small run shows every way an order
    can go bad); 1 or more is a number of orders, for kinds that cost a lot each."""
    kinds = [
        kind
        for kind, share in shares.items()
        for _ in range(int(share) if share >= 1 else max(1, round(count * share)))
    ]
    kinds += ["good"] * (count - len(kinds))
    rng.shuffle(kinds)
    return [Order(f"order-{n:06d}", kind) for n, kind in enumerate(kinds, 1)]


class OrderHandler:
    """Books orders, failing the way the demo's bad orders are meant to fail. Completed
    orders are counted per message id, so a duplicate delivery would show up as a 2."""

    def __init__(self) -> None:
        self.completed: Counter[str] = Counter()
        self.customers = {f"cust-{n}" for n in range(CUSTOMERS)}

    def __call__(self, message: ReceivedMessage) -> None:
        order = json.loads(message.body)
        if order["customer"] not in self.customers:
            raise UnknownCustomerError(f"unknown customer {order['customer']!r}")
        if order["warehouse"] == "east" and message.delivery_count == 1:
            raise TimeoutError("warehouse east did not answer within 2 s")
        if order["warehouse"] == "west":
            raise ConnectionError("warehouse west is offline")
        self.completed[message.message_id] += 1


def send_orders(
    broker: Broker,
    orders: list[Order],
    console: Console,
    seed: int,
    encode: Encoder | None = None,
) -> None:
    """Send the orders in batches (each one transaction) with a progress bar."""
    rng = random.Random(seed)
    sender = broker.sender(QUEUE)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("sending orders", total=len(orders))
        for start in range(0, len(orders), SEND_BATCH):
            batch = orders[start : start + SEND_BATCH]
            sender.send([order.message(rng, encode) for order in batch])
            progress.advance(task, len(batch))


def dead_lettered(broker: Broker) -> Iterator[ReceivedMessage]:
    """Every message in the dead-letter queue, paging by sequence number."""
    after = 0
    while page := broker.peek(DLQ, from_sequence=after, max_messages=PAGE):
        yield from page
        after = page[-1].sequence_number + 1


def check(broker: Broker, orders: list[Order], handler: OrderHandler) -> list[tuple[str, bool]]:
    """The demo's claims, each with whether it holds."""
    dead: Counter[str] = Counter()
    reasons: dict[str, str | None] = {}
    for message in dead_lettered(broker):
        dead[message.message_id] += 1
        reasons[message.message_id] = message.dead_letter_reason
    completed = handler.completed
    ok_once = all(
        completed[o.order_id] == 1 and not dead[o.order_id]
        for o in orders
        if o.kind not in EXPECTED_REASON
    )
    dead_right = all(
        dead[o.order_id] == 1
        and not completed[o.order_id]
        and reasons[o.order_id] == EXPECTED_REASON[o.kind]
        for o in orders
        if o.kind in EXPECTED_REASON
    )
    counts = broker.counts(QUEUE)
    known = {o.order_id for o in orders}
    return [
        ("good and flaky orders completed exactly once", ok_once),
        ("bad orders dead-lettered once with the expected reason", dead_right),
        ("nothing unknown completed or dead-lettered", set(completed) | set(dead) <= known),
        ("nothing left in the queue", sum(counts[state] for state in LIVE_STATES) == 0),
        ("audit: every message accounted for", broker.audit().ok),
    ]


def summary(
    orders: list[Order],
    handler: OrderHandler,
    broker: Broker,
    stats: ProcessorStats,
    elapsed: float,
) -> Table:
    """What happened, with the handler runs showing the retries the failures cost."""
    table = Table(title="demo summary")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("orders sent", str(len(orders)))
    table.add_row("handler runs", str(stats.handler_runs))
    table.add_row("completed", str(sum(handler.completed.values())))
    for group in broker.dead_letter_groups(QUEUE, by="reason"):
        table.add_row(f"dead-lettered: {group.key}", str(group.count))
    table.add_row("processing time", f"{elapsed:.1f} s")
    table.add_row("messages / s", f"{len(orders) / elapsed:,.0f}")
    return table


def fresh_store(directory: Path) -> str:
    """The URL of a new, empty ``demo.db`` in ``directory`` (an old one is removed)."""
    directory.mkdir(parents=True, exist_ok=True)
    db = directory / "demo.db"
    for path in (db, db.with_name("demo.db-wal"), db.with_name("demo.db-shm")):
        path.unlink(missing_ok=True)
    return f"sqlite:///{db}"


def print_inspection(console: Console, broker: Broker, url: str) -> None:
    """The commands that show the dead-letter queue, with a real sequence number."""
    poisoned = DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED.value
    seq = next(
        (m.sequence_number for m in dead_lettered(broker) if m.dead_letter_reason == poisoned),
        "SEQ",
    )
    console.print(
        "\nInspect the dead-letter queue:\n"
        f"  poisonq --url {url} dlq list {QUEUE} --by fingerprint\n"
        f"  poisonq --url {url} dlq list {QUEUE} --by reason\n"
        f"  poisonq --url {url} peek '{DLQ}' --max 5\n"
        f"  poisonq --url {url} dlq show {QUEUE} {seq}\n"
        f"  poisonq --url {url} dlq resubmit {QUEUE} --reason {poisoned}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def report_checks(console: Console, results: list[tuple[str, bool]]) -> None:
    """Print each claim with a tick or a cross; exit 1 if any does not hold."""
    for claim, holds in results:
        console.print(f"[green]✓[/] {claim}" if holds else f"[bold red]✗ {claim}[/]")
    if not all(holds for _, holds in results):
        raise SystemExit(1)


def main(directory: Path = Path("demo"), orders: int = 20_000, seed: int = 7) -> None:
    """Run the demo in ``directory`` (its ``demo.db`` is replaced); raise ``SystemExit(1)``
    if any check fails."""
    console = Console()
    url = fresh_store(directory)
    generated = make_orders(orders, random.Random(seed))
    handler = OrderHandler()
    with connect(url) as broker:
        broker.create_queue(QUEUE, max_delivery_count=3, lock_duration=30)
        send_orders(broker, generated, console, seed)
        started = time.monotonic()
        # A short idle wait: abandoned orders are active again at once, so an empty receive
        # means the queue is drained, and the rate shown is not diluted by waiting.
        processor = Processor(broker, QUEUE, handler, batch_size=100, max_wait=0.2)
        with console.status("processing orders"):
            stats = processor.run(until_idle=True)
        elapsed = time.monotonic() - started
        results = check(broker, generated, handler)
        console.print(summary(generated, handler, broker, stats, elapsed))
        print_inspection(console, broker, url)
    report_checks(console, results)
