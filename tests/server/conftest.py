"""What the server tests share: the app on a real SQLite file, driven in-process with the
ASGI test client, and a dead-letter queue filled the way failing consumers fill one."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from httpx2 import Response

import poisonq
from poisonq import BatchRun, Broker, DeadLetter, ManualClock, Message
from poisonq.server import create_app
from poisonq.server.background import BackgroundServer
from poisonq.store.base import TaskRecord

if TYPE_CHECKING:
    from playwright.sync_api import Browser

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MALICIOUS = '<script>window.__pwned = true</script><img src=x onerror="window.__pwned=true">'


@pytest.fixture
def app(broker: Broker) -> FastAPI:
    return create_app(broker, token=TOKEN)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as opened:
        yield opened


@pytest.fixture
def open_client(broker: Broker) -> Iterator[TestClient]:
    """A server whose reads need no token."""
    with TestClient(create_app(broker, token=TOKEN, open_reads=True)) as opened:
        yield opened


def _lookup(customer: str) -> None:
    raise KeyError(customer)


def _parse(body: bytes) -> None:
    raise ValueError(f"bad amount in {body[:10]!r}")


@pytest.fixture
def dead(broker: Broker, queue: str) -> dict[str, list[int]]:
    """Dead-letters of ``orders``: three poisoned by a KeyError in one place (after three
    deliveries), two dead-lettered by the application as ``InvalidOrder`` with a ValueError,
    and one ``InvalidOrder`` whose body and properties are hostile HTML."""
    sender = broker.sender(queue)
    receiver = broker.receiver(queue)
    poisoned = sender.send(
        [Message(body=f'{{"id": {n}}}', subject="order", message_id=f"o-{n}") for n in range(3)]
    )
    for customer in ("cust-17", "cust-42", "cust-99"):
        try:
            _lookup(customer)
        except KeyError as exc:
            receiver.abandon(receiver.receive(max_messages=3), error=exc)
    invalid = sender.send([Message(body=f"amount=-{n}", subject="refund") for n in range(2)])
    for message in receiver.receive(max_messages=2):
        try:
            _parse(message.body)
        except ValueError as exc:
            receiver.dead_letter(message, "InvalidOrder", "amount below zero", error=exc)
    hostile = sender.send(
        Message(body=MALICIOUS, subject="<b>refund</b>", properties={"note": MALICIOUS})
    )
    receiver.dead_letter(receiver.receive(max_messages=1), "InvalidOrder", MALICIOUS)
    return {"MaxDeliveryCountExceeded": poisoned, "InvalidOrder": invalid, "hostile": hostile}


def record(broker: Broker, clock: ManualClock, queue: str, consumer: str, sizes: list[int]) -> None:
    """Batches of ``sizes`` messages; each takes one second more than the one before, and
    the second dead-letters its first message as ``MALICIOUS``."""
    for number, size in enumerate(sizes, 1):
        broker.sender(queue).send([Message(body=f"m{n}") for n in range(size)])
        lease = broker.acquire_lease(queue, consumer, number, max_messages=size)
        assert lease is not None
        started = clock.now()
        clock.advance(number)
        if number == 2:
            broker.settle_held(
                queue, [DeadLetter(lease.min_sequence, lease.lock_token, MALICIOUS, None)]
            )
        broker.complete_lease(lease, BatchRun(started, float(number)))


def finished(client: TestClient, started: Response) -> str:
    """The page of the task a UI form started (its answer redirects there), once the task
    has finished."""
    assert started.status_code == 303, started.text
    location = started.headers["location"]
    wait_for_task(client.app, int(location.split("/")[3].split("?")[0]))  # type: ignore[arg-type]
    return client.get(location).text


def wait_for_task(app: FastAPI, task_id: int) -> TaskRecord:
    """Wait until a task the server started (in a thread of its own) has finished."""
    broker: Broker = app.state.poisonq.broker
    deadline = time.monotonic() + 10
    while (record := broker.task(task_id)).status == "running" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert record.status != "running", f"task {task_id} still runs"
    return record


class GatedClock(ManualClock):
    """A manual clock whose ``sleep`` (the rate limiter's pause) waits until the test lets
    it go, so a test can look at a task between two of its chunks."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeping = threading.Event()
        self.go = threading.Event()

    def sleep(self, seconds: float) -> None:
        self.sleeping.set()
        assert self.go.wait(10), "the test never released the task"
        super().sleep(seconds)


@pytest.fixture
def gated(url: str) -> Iterator[tuple[Broker, GatedClock]]:
    """A broker on a :class:`GatedClock` with ten messages dead-lettered as ``Broken``."""
    clock = GatedClock()
    with poisonq.connect(url, clock=clock) as broker:
        broker.create_queue("orders")
        broker.sender("orders").send([Message(body=str(n)) for n in range(10)])
        receiver = broker.receiver("orders")
        receiver.dead_letter(receiver.receive(max_messages=10), "Broken")
        yield broker, clock
        clock.go.set()  # never leave a task thread waiting


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One Chromium for a module of browser tests (Playwright imported only for them)."""
    from playwright.sync_api import sync_playwright

    from tests.server.chromium import launch

    with sync_playwright() as playwright:
        opened = launch(playwright)
        yield opened
        opened.close()


@pytest.fixture
def live(app: FastAPI) -> Iterator[BackgroundServer]:
    with BackgroundServer(app) as server:
        yield server
