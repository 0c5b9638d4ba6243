"""``/metrics``: Prometheus text read from the store at each scrape, so numbers written by
other processes are there and exact."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from poisonq import Broker, ManualClock, Message, RetryPolicy
from poisonq.engine.driving import drive
from poisonq.server import create_app
from poisonq.server.metrics import OTHER_REASONS, TOP_REASONS
from tests.helpers import assert_balanced
from tests.server.conftest import AUTH, TOKEN, record


def scrape(client: TestClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    answer = client.get("/metrics", headers=AUTH)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_depth_per_entity_subqueue_and_state(
    client: TestClient, broker: Broker, dead: dict[str, list[int]]
) -> None:
    broker.sender("orders").send([Message(body=str(n)) for n in range(4)])
    broker.receiver("orders").receive(max_messages=1)
    samples = scrape(client)
    main = {"queue": "orders", "subqueue": "main"}
    assert value(samples, "poisonq_messages", **main, state="active") == 3
    assert value(samples, "poisonq_messages", **main, state="locked") == 1
    dlq = {"queue": "orders", "subqueue": "deadletter"}
    assert value(samples, "poisonq_messages", **dlq, state="dead_lettered") == 6
    assert value(samples, "poisonq_entity_status", **main, status="active") == 1
    assert value(samples, "poisonq_entity_status", **main, status="disabled") == 0
    assert value(samples, "poisonq_size_bytes", **main) > 0


def test_dead_letters_by_reason(client: TestClient, dead: dict[str, list[int]]) -> None:
    samples = scrape(client)
    assert value(samples, "poisonq_dead_letters", queue="orders", reason="InvalidOrder") == 3
    reason = "MaxDeliveryCountExceeded"
    assert value(samples, "poisonq_dead_letters", queue="orders", reason=reason) == 3


def test_the_reason_label_keeps_the_largest_reasons_and_sums_the_rest_as_other(
    client: TestClient, broker: Broker, queue: str
) -> None:
    """Reasons are free text from applications: past ``TOP_REASONS`` per queue, the smaller
    groups are one ``other`` series, and the API still lists every reason."""
    reasons = [f"reason-{n:02}" for n in range(TOP_REASONS + 5)]
    sizes = {reason: 2 + n for n, reason in enumerate(reasons)}  # reason-14 the largest
    broker.sender(queue).send([Message(body=r) for r in reasons for _ in range(sizes[r])])
    receiver = broker.receiver(queue)
    for message in receiver.receive(max_messages=sum(sizes.values())):
        receiver.dead_letter(message, message.body.decode())
    found = {
        labels: count
        for (name, labels), count in scrape(client).items()
        if name == "poisonq_dead_letters"
    }
    largest = reasons[-TOP_REASONS:]
    assert found == {
        **{frozenset({("queue", queue), ("reason", r)}): sizes[r] for r in largest},
        frozenset({("queue", queue), ("reason", OTHER_REASONS)}): sum(
            sizes[r] for r in reasons[:-TOP_REASONS]
        ),
    }
    groups = client.get(f"/api/queues/{queue}/deadletters/groups", headers=AUTH).json()
    assert sorted(g["key"] for g in groups) == reasons
    assert_balanced(broker)


def test_lifetime_counters(
    client: TestClient, broker: Broker, clock: ManualClock, dead: dict[str, list[int]]
) -> None:
    sender, receiver = broker.sender("orders"), broker.receiver("orders")
    sender.send([Message(body=str(n)) for n in range(3)])
    receiver.complete(receiver.receive(max_messages=2))
    receiver.receive(max_messages=1)
    clock.advance(31)  # the lock (30 s) expires and counts as an abandon at the next receive
    receiver.receive(max_messages=1)
    broker.resubmit("orders", reason="InvalidOrder", rate=None)
    main = {"queue": "orders", "subqueue": "main"}
    dlq = {"queue": "orders", "subqueue": "deadletter"}
    samples = scrape(client)
    assert value(samples, "poisonq_sent_total", **main) == 9
    assert value(samples, "poisonq_completed_total", **main) == 2
    assert value(samples, "poisonq_lock_expiries_total", **main) == 1
    assert value(samples, "poisonq_dead_lettered_total", **main) == 6
    assert value(samples, "poisonq_resubmitted_total", **dlq) == 3
    assert value(samples, "poisonq_moved_in_total", **main) == 3
    assert value(samples, "poisonq_dropped_total", **main) == 0
    # The fixture abandoned three messages three times each, and the third poisoned them.
    assert value(samples, "poisonq_abandoned_total", **main) == 9
    assert value(samples, "poisonq_poisoned_total", **main) == 3


def test_poison_events_count_dropped_poison_and_spent_deferred_messages(
    client: TestClient, broker: Broker
) -> None:
    broker.create_queue(
        "audit", retry=RetryPolicy(receive_retry_count=0, receive_error_handling="drop")
    )
    broker.create_queue("orders", max_delivery_count=1)
    broker.sender("audit").send([Message(body=b"a")] * 2)
    broker.sender("orders").send(Message(body=b"o"))
    audit = broker.receiver("audit")
    audit.abandon(audit.receive(max_messages=2), error=TimeoutError("slow"))
    orders = broker.receiver("orders")
    deferred = orders.receive()
    orders.defer(deferred)
    assert orders.receive_deferred(deferred[0].sequence_number) == []  # spent: dead-lettered
    samples = scrape(client)
    assert value(samples, "poisonq_poisoned_total", queue="audit", subqueue="main") == 2
    assert value(samples, "poisonq_dropped_total", queue="audit", subqueue="main") == 2
    assert value(samples, "poisonq_abandoned_total", queue="audit", subqueue="main") == 2
    assert value(samples, "poisonq_poisoned_total", queue="orders", subqueue="main") == 1
    reason = "MaxDeliveryCountExceeded"
    assert value(samples, "poisonq_dead_letters", queue="orders", reason=reason) == 1


def test_counters_include_what_other_processes_did(
    client: TestClient, url: str, queue: str
) -> None:
    assert value(scrape(client), "poisonq_sent_total", queue="orders", subqueue="main") == 0
    script = textwrap.dedent(
        f"""
        import poisonq
        with poisonq.connect({url!r}) as broker:
            broker.sender("orders").send([poisonq.Message(body=b"x")] * 5)
            receiver = broker.receiver("orders")
            receiver.complete(receiver.receive(max_messages=2))
            receiver.dead_letter(receiver.receive(max_messages=1), "Broken")
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    samples = scrape(client)
    main = {"queue": "orders", "subqueue": "main"}
    assert value(samples, "poisonq_sent_total", **main) == 5
    assert value(samples, "poisonq_completed_total", **main) == 2
    assert value(samples, "poisonq_messages", **main, state="active") == 2
    assert value(samples, "poisonq_dead_letters", queue="orders", reason="Broken") == 1


def test_metrics_need_the_token_unless_reads_are_open(
    client: TestClient, open_client: TestClient, queue: str
) -> None:
    assert client.get("/metrics").status_code == 401
    assert open_client.get("/metrics").status_code == 200


def test_each_pipeline_consumers_last_batch(
    client: TestClient, broker: Broker, clock: ManualClock, queue: str
) -> None:
    assert not any(name.startswith("poisonq_pipeline") for name, _ in scrape(client))
    record(broker, clock, queue, "nightly", [3, 6])
    broker.create_queue("refunds")
    record(broker, clock, "refunds", "refunder", [2])
    samples = scrape(client)
    nightly = {"queue": "orders", "consumer": "nightly"}
    last = broker.pipeline_batches("nightly")[-1]
    figures = {
        "seconds": 2.0,
        "messages": 6,
        "completed": 5,
        "retried": 0,
        "dead_lettered": 1,
        "lease": 2,
        "timestamp_seconds": last.started_at + 2.0,
    }
    for name, expected in figures.items():
        assert value(samples, f"poisonq_pipeline_last_batch_{name}", **nightly) == expected
    refunder = {"queue": "refunds", "consumer": "refunder"}
    assert value(samples, "poisonq_pipeline_last_batch_messages", **refunder) == 2


def test_a_queue_auto_disabled_by_locks_that_ran_out_shows_at_the_next_scrape(
    client: TestClient, broker: Broker, clock: ManualClock
) -> None:
    """PoisonqQueueNotReceiving reads poisonq_entity_status: it turns while every consumer
    is down, with no receive after the locks ran out."""
    broker.create_queue(
        "payments", auto_disable_after_rollbacks=2, lock_duration=5, max_delivery_count=10
    )
    broker.sender("payments").send([Message(body="a"), Message(body="b")])
    broker.receiver("payments").receive(max_messages=2)
    main = {"queue": "payments", "subqueue": "main"}
    assert value(scrape(client), "poisonq_entity_status", **main, status="active") == 1
    clock.advance(5)
    samples = scrape(client)
    assert value(samples, "poisonq_entity_status", **main, status="receive_disabled") == 1
    assert value(samples, "poisonq_entity_status", **main, status="active") == 0
    assert value(samples, "poisonq_messages", **main, state="locked") == 0
    assert value(samples, "poisonq_lock_expiries_total", **main) == 2
    listed = client.get("/api/entities", headers=AUTH).json()
    assert {e["name"]: e["status"] for e in listed}["payments"] == "receive_disabled"


def test_a_public_url_is_on_metrics_for_the_alerts_absolute_links(
    broker: Broker, client: TestClient
) -> None:
    """Alertmanager cannot open a relative ``/ui/`` link: with ``public_url`` the server
    says where its UI is (``poisonq_ui_info``), and the alerts' annotations link there
    (deploy/prometheus/poisonq-alerts.test.yml proves it with promtool); without one it
    says nothing and the links stay relative."""
    assert not [key for key in scrape(client) if key[0] == "poisonq_ui_info"]
    app = create_app(broker, token=TOKEN, public_url="https://poisonq.example.com/")
    with TestClient(app) as public:
        samples = scrape(public)
    assert value(samples, "poisonq_ui_info", url="https://poisonq.example.com/ui/") == 1


def test_a_scrape_reads_beside_a_long_read_that_holds_the_servers_connection(
    client: TestClient, broker: Broker, dead: dict[str, list[int]]
) -> None:
    """A scrape reads through a connection of its own: while another request's read holds
    the server's connection (an audit page, a body search), the scrape answers, with the
    store's numbers, instead of waiting behind it."""
    holding, release = threading.Event(), threading.Event()

    async def long_read() -> None:
        async with broker.store.reading():  # the server's connection, as a long page holds it
            holding.set()
            release.wait(60)

    reader = threading.Thread(target=lambda: drive(long_read()))
    reader.start()
    try:
        assert holding.wait(30)
        answered: list[dict[tuple[str, frozenset[tuple[str, str]]], float]] = []
        scraper = threading.Thread(target=lambda: answered.append(scrape(client)))
        scraper.start()
        scraper.join(60)
        assert not scraper.is_alive(), "the scrape waited behind the server's connection"
    finally:
        release.set()
        reader.join()
    [samples] = answered
    held = value(
        samples, "poisonq_messages", queue="orders", subqueue="deadletter", state="dead_lettered"
    )
    assert held == broker.counts("orders")["dead_lettered"] == 6
