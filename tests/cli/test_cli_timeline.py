"""``poisonq pipeline list`` and ``show`` on both stores: the consumers, a consumer's timeline
as a table with a bar per batch, or JSON; an unknown consumer is one red line with the
nearest names."""

from __future__ import annotations

import re
import time

import pytest
from prometheus_client import generate_latest
from rich.console import Console

from poisonq import BatchRun, Broker, DeadLetter, Message, PipelineLeaseHeldError
from poisonq.cli.timeline import timeline_view
from poisonq.server.metrics import registry
from tests.cli.conftest import assert_one_error_line, run, run_json


@pytest.fixture
def timeline(api: Broker, orders: str) -> str:
    """Three batches of consumer ``nightly``: 4, 8 and 12 messages; the second dead-letters
    one ``InvalidOrder`` and takes twice as long as the first, the third three times."""
    for number in (1, 2, 3):
        api.sender(orders).send([Message(body=f"m{n}") for n in range(4 * number)])
        lease = api.acquire_lease(orders, "nightly", number, max_messages=100)
        assert lease is not None
        started = time.time()
        if number == 2:
            bad = DeadLetter(lease.min_sequence, lease.lock_token, "InvalidOrder", None)
            api.settle_held(orders, [bad])
        api.complete_lease(lease, BatchRun(started, 1.0 * number + 0.01, isolation_jobs=number))
    return "nightly"


def test_show_prints_a_row_and_a_bar_per_batch(url: str, timeline: str) -> None:
    shown = run(url, "pipeline", "show", timeline).stdout
    assert "consumer nightly on orders: 3 batch(es)" in shown
    rows = [line.split() for line in shown.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["1", "2", "3"]
    assert rows[1][3:9] == ["8", "7", "0", "1", "InvalidOrder", "1"]
    bars = [len(row[-1]) for row in rows]
    # The longest batch is a full bar, a tenth of the terminal (COLUMNS=200).
    assert bars[2] == 20 and bars[0] < bars[1] < bars[2]
    assert "░" in rows[1][-1] and "░" not in rows[0][-1]  # its dead letter shows
    assert "completed" in shown.splitlines()[-1]  # the legend


def test_show_json(url: str, timeline: str) -> None:
    batches = run_json(url, "pipeline", "show", timeline, "--queue", "orders")
    assert [(b["lease"], b["size"], b["completed"]) for b in batches] == [
        (1, 4, 4),
        (2, 8, 7),
        (3, 12, 12),
    ]
    assert batches[1]["dead_lettered"] == {"InvalidOrder": 1}
    assert batches[2]["isolation_jobs"] == 3 and batches[2]["messages_per_second"] > 0
    newest = run_json(url, "pipeline", "show", timeline, "--last", "2")
    assert [b["lease"] for b in newest] == [2, 3]


def test_list_names_each_consumer_with_its_last_batch(url: str, api: Broker, timeline: str) -> None:
    """``pipeline list`` names every consumer with a timeline, with its last batch, so no
    name has to be remembered."""
    assert run_json(url, "pipeline", "list") == [p.to_json() for p in api.pipelines()]
    (row,) = [line.split() for line in run(url, "pipeline", "list").stdout.splitlines()
              if line.strip().startswith("nightly")]  # fmt: skip
    assert row[:4] == ["nightly", "orders", "3", "3"] and row[-3:] == ["12", "0", "4"]  # 12 in 3 s


def test_show_an_unknown_consumer_or_queue(url: str, timeline: str) -> None:
    unknown = run(url, "pipeline", "show", "nightlly", code=2)
    assert_one_error_line(unknown, "no pipeline batches recorded", "did you mean 'nightly'?")
    elsewhere = run(url, "pipeline", "show", timeline, "--queue", "ordres", code=2)
    assert_one_error_line(elsewhere, "no queue 'ordres'")


def test_show_help_explains_the_timeline(url: str) -> None:
    shown = run(url, "pipeline", "show", "--help").stdout
    assert "--keep-batches" in shown and "--json" in shown and "cut by outcome" in shown


@pytest.mark.parametrize("width", [80, 100])
def test_show_fits_a_terminal_of_80_or_100_columns(
    api: Broker, orders: str, timeline: str, width: int
) -> None:
    """Every line within the width, every number whole, one line a batch; the reasons cut
    with an ellipsis, the bars a tenth of the width."""
    api.sender(orders).send([Message(body=str(n)) for n in range(3)])
    lease = api.acquire_lease(orders, timeline, 4, max_messages=100)
    assert lease is not None
    started = time.time()
    reasons = ("MaxDeliveryCountExceeded", "UnknownCustomerError", "TTLExpiredException")
    api.settle_held(
        orders,
        [
            DeadLetter(lease.min_sequence + n, lease.lock_token, r, None)
            for n, r in enumerate(reasons)
        ],
    )
    api.complete_lease(lease, BatchRun(started, 4.01, isolation_jobs=12))
    console = Console(width=width, record=True, color_system=None)
    console.print(timeline_view(timeline, api.pipeline_batches(timeline), width))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= width
    rows = [line.split() for line in lines if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["1", "2", "3", "4"]  # one line each
    assert rows[3][2:7] == ["4.01", "3", "0", "0", "3"]  # secs, size, done, retry, dead whole
    assert rows[3][-3:-1] == ["12", "0.75"]  # jobs, msg/s to two figures (was "1"), the bar
    assert "…" in " ".join(rows[3])  # three reasons do not fit: cut
    assert len(rows[3][-1]) == width // 10  # the longest batch's bar


def _metric_consumers(broker: Broker) -> set[str]:
    """The consumers /metrics reports a last batch of (what the stalled alert reads)."""
    scraped = generate_latest(registry(broker)).decode()
    return set(
        re.findall(
            r'poisonq_pipeline_last_batch_timestamp_seconds\{[^}]*consumer="([^"]+)"', scraped
        )
    )


def test_forget_a_retired_consumer_takes_its_timeline_and_its_metrics(
    api: Broker, orders: str, timeline: str
) -> None:
    api.sender(orders).send(Message(body="x"))
    other = api.acquire_lease(orders, "hourly", 1, max_messages=10)
    assert other is not None
    api.complete_lease(other, BatchRun(time.time(), 0.5))
    assert _metric_consumers(api) == {"nightly", "hourly"}
    counts = api.counts(orders)
    forgot = run(api.url, "pipeline", "forget", timeline)
    assert forgot.stdout.strip() == "forgot consumer nightly on orders: 3 batch(es)"
    assert _metric_consumers(api) == {"hourly"}  # the alert has nothing left to fire on
    assert [p.consumer for p in api.pipelines()] == ["hourly"]
    assert api.lease(orders, timeline, None) is None  # its settled leases went too
    assert_one_error_line(run(api.url, "pipeline", "show", timeline, code=2), "no pipeline")
    again = run(api.url, "pipeline", "forget", timeline, code=2)
    assert_one_error_line(again, "no pipeline batches recorded for consumer 'nightly'")
    assert api.counts(orders) == counts  # no message changed


def test_forget_refuses_a_consumer_holding_a_live_lease_unless_forced(
    api: Broker, orders: str, timeline: str
) -> None:
    api.sender(orders).send([Message(body=str(n)) for n in range(5)])
    live = api.acquire_lease(orders, timeline, 4, max_messages=10)  # a batch under way
    assert live is not None
    refused = run(api.url, "pipeline", "forget", timeline, code=2)
    assert_one_error_line(
        refused, "consumer 'nightly' on 'orders' holds 5 message(s) under lease 4", "force"
    )
    with pytest.raises(PipelineLeaseHeldError) as held:
        api.forget_pipeline(timeline)
    assert (held.value.lease, held.value.held) == (4, 5)
    assert _metric_consumers(api) == {"nightly"}  # nothing was forgotten
    assert api.counts(orders)["locked"] == 5
    run(api.url, "pipeline", "forget", timeline, "--force")
    assert _metric_consumers(api) == set()
    assert api.counts(orders)["locked"] == 0 and api.counts(orders)["active"] == 5
    [again] = api.receiver(orders).receive(max_messages=1)
    assert again.delivery_count == 1  # given back as never delivered
