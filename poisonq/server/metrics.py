"""``/metrics`` in Prometheus' text format, read from the store at each scrape.

Every number comes from the store, not from counters in this process: the messages were
sent, completed and dead-lettered by other processes (workers, Spark executors), and the
store's per-entity ledger is bumped in the same transaction as each transition, so a scrape
of any server on the same store sees the same, exact totals, and a restart resets nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from poisonq.client import Broker, connect
from poisonq.model import LIVE_STATES, EntityStatus, MessageState
from poisonq.names import parse_address

_LABELS = ["queue", "subqueue"]
TOP_REASONS = 10
"""Dead-letter reasons with a series of their own per queue, the largest groups: the rest are
summed as ``other``. A reason is free text an application sets, so without a bound each new
text would be a new series for Prometheus to keep; the API lists every reason."""
OTHER_REASONS = "other"
# What each lifetime counter of the ledger counts (the ledger's field names are the metric
# names: ``poisonq_sent_total`` ...); ``size_bytes`` is a level, exported as a gauge.
_COUNTERS = {
    "sent": "Messages sent to the entity",
    "moved_in": "Messages moved into the entity (dead-lettered into it, resubmitted to it)",
    "completed": "Messages completed",
    "dropped": "Messages dropped (poison with the drop action, expired, purged)",
    "moved_out": "Messages moved out of the entity (dead-lettered, resubmitted)",
    "dead_lettered": "Messages the entity dead-lettered",
    "resubmitted": "Dead-lettered messages resubmitted from the entity",
    "lock_expiries": "Locks that expired (each counts as an abandon)",
    "abandoned": "Messages abandoned by a receiver (lock expiries are counted apart)",
    "poisoned": "Poison events: messages that used every attempt (dead-lettered or dropped)",
}


# The figures of a pipeline consumer's last batch (``poisonq_pipeline_last_batch_<name>``).
_PIPELINE_GAUGES = {
    "timestamp_seconds": "When the consumer's last batch ended (its job's end, epoch seconds)",
    "seconds": "How long the consumer's last batch ran",
    "messages": "Messages in the consumer's last batch (its lease)",
    "completed": "Messages of the last batch completed",
    "retried": "Messages of the last batch given back to be retried",
    "dead_lettered": "Messages of the last batch dead-lettered",
    "lease": "The lease number of the consumer's last batch",
}


class ScrapeConnection:
    """The broker scrapes read through: a connection of its own to the server's store,
    opened at the first scrape. A SQLite store's connection takes one transaction at a time,
    so a scrape through the server's would wait behind whatever long read holds it (the audit
    page, a body search, a resubmit's chunk): at a million dead letters two audit pages held a
    scrape for 10.6 s, past Prometheus's default timeout, in the incident the scrape is for.
    On its own connection it reads beside them (SQLite's WAL lets readers and a writer work
    at once; a PostgreSQL store gets a pool of its own)."""

    def __init__(self, broker: Broker) -> None:
        self._server = broker
        self._own: Broker | None = None
        self._lock = threading.Lock()

    def __call__(self) -> Broker:
        with self._lock:
            if self._own is None:
                self._own = connect(self._server.url, clock=self._server.clock, create=False)
            return self._own

    def close(self) -> None:
        with self._lock:
            if self._own is not None:
                self._own.close()
                self._own = None


class BrokerCollector(Collector):
    """Depth per entity, subqueue and state; dead-letters by reason; the ledger's totals;
    each pipeline consumer's last batch."""

    def __init__(self, broker: Broker | ScrapeConnection) -> None:
        self._broker = broker

    @property
    def broker(self) -> Broker:
        given = self._broker
        return given() if isinstance(given, ScrapeConnection) else given

    def collect(self) -> Iterator[Metric]:
        entities = self.broker.entities()
        depth = GaugeMetricFamily(
            "poisonq_messages",
            "Messages held, by queue, subqueue (main for the queue itself) and state",
            labels=[*_LABELS, "state"],
        )
        status = GaugeMetricFamily(
            "poisonq_entity_status",
            "1 for the entity's current status (active, disabled, send_disabled, ...)",
            labels=[*_LABELS, "status"],
        )
        size = GaugeMetricFamily(
            "poisonq_size_bytes", "Bytes of the messages the entity holds", labels=_LABELS
        )
        counters = {
            name: CounterMetricFamily(f"poisonq_{name}", help_text, labels=_LABELS)
            for name, help_text in _COUNTERS.items()
        }
        for info in entities:
            address = parse_address(info.name)
            labels = [address.entity, address.subqueue.value if address.subqueue else "main"]
            states = [*LIVE_STATES, *([MessageState.DEAD_LETTERED] if address.subqueue else [])]
            for state in states:
                held = info.counts.get(state.value, 0)
                depth.add_metric([*labels, state.value], held)
            for value in EntityStatus:
                status.add_metric([*labels, value.value], 1.0 if info.status is value else 0.0)
            size.add_metric(labels, info.ledger.size_bytes)
            for name, family in counters.items():
                family.add_metric(labels, getattr(info.ledger, name))
        yield depth
        yield status
        yield size
        yield from counters.values()
        yield self._dead_letters([parse_address(i.name).entity for i in entities])
        yield from self._pipelines()

    def _dead_letters(self, queues: list[str]) -> Metric:
        family = GaugeMetricFamily(
            "poisonq_dead_letters",
            f"Messages held in the queue's dead-letter queue, by dead-letter reason (the"
            f" {TOP_REASONS} largest; the rest as {OTHER_REASONS})",
            labels=["queue", "reason"],
        )
        for queue in dict.fromkeys(queues):
            groups = sorted(self.broker.dead_letter_groups(queue, "reason"), key=lambda g: -g.count)
            by_label: dict[str, int] = {}
            for rank, group in enumerate(groups):
                label = (group.key or "") if rank < TOP_REASONS else OTHER_REASONS
                by_label[label] = by_label.get(label, 0) + group.count
            for label, count in by_label.items():
                family.add_metric([queue, label], count)
        return family

    def _pipelines(self) -> Iterator[Metric]:
        """Each pipeline consumer's last batch (its timeline's newest record): a stall shows
        as a timestamp that stops moving while the queue has messages."""
        families = {
            name: GaugeMetricFamily(
                f"poisonq_pipeline_last_batch_{name}", help_text, labels=["queue", "consumer"]
            )
            for name, help_text in _PIPELINE_GAUGES.items()
        }
        for summary in self.broker.pipelines():
            last, labels = summary.last, [summary.queue, summary.consumer]
            figures = {
                "timestamp_seconds": last.started_at + last.seconds,
                "seconds": last.seconds,
                "messages": last.size,
                "completed": last.completed,
                "retried": last.retried,
                "dead_lettered": last.dead_lettered_total,
                "lease": last.lease,
            }
            for name, family in families.items():
                family.add_metric(labels, figures[name])
        yield from families.values()


def registry(broker: Broker | ScrapeConnection, public_url: str | None = None) -> CollectorRegistry:
    """A registry of its own per server (no global state): the broker's metrics, and with
    ``public_url`` (``serve --public-url``) ``poisonq_ui_info{url=".../ui/"} 1``, which the
    alerts' annotations read to link the UI absolutely (Alertmanager cannot open a relative
    link)."""
    built = CollectorRegistry(auto_describe=False)
    built.register(BrokerCollector(broker))
    if public_url is not None:
        Info("poisonq_ui", "Where operators open the web UI", registry=built).info(
            {"url": public_url.rstrip("/") + "/ui/"}
        )
    return built
