"""The kill scenarios: each sets up a store, runs a real program, kills its process group at a
random moment (drawn from the run's seeded generator), runs it again to the end, and returns
the :class:`~tests.chaos.verdict.Verdict` of the end state."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from random import Random

import pyarrow.dataset as ds

import poisonq
from poisonq.testing.pgserver import TemporaryServer
from tests.chaos import children
from tests.chaos.verdict import Holding, Verdict, check, double_holders

ROOT = Path(__file__).resolve().parents[2]
CHILDREN = [sys.executable, "-m", "tests.chaos.children"]
POISONQ = [sys.executable, "-c", "from poisonq.cli import main; main()"]
BAD_EVERY = 97  # about 1 % of the orders are bad
RUN_TIMEOUT = 300.0


@dataclasses.dataclass(frozen=True)
class Store:
    """The store a run works on: a new database, and the PostgreSQL server it is on (which
    the outage scenario restarts), if it is one."""

    url: str
    server: TemporaryServer | None = None


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[Store, Path, Random], Verdict]
    stores: tuple[str, ...]
    spark: bool = False
    # Restarts the PostgreSQL server every run shares: it runs alone, never beside other runs.
    alone: bool = False


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable}


def _start(argv: list[str], work: Path, name: str) -> subprocess.Popen[bytes]:
    """Start a program in a new session (its own process group, so a kill takes the JVM and
    the Python workers of a Spark program with it); its output goes to files in ``work``."""
    with open(work / f"{name}.out", "ab") as out, open(work / f"{name}.err", "ab") as err:
        return subprocess.Popen(
            argv, cwd=ROOT, env=_env(), start_new_session=True, stdout=out, stderr=err
        )


def _kill_after(process: subprocess.Popen[bytes], delay: float) -> int:
    """SIGKILL the process group ``delay`` seconds from now, unless it has finished by then;
    1 if the kill landed on a running program."""
    try:
        process.wait(timeout=delay)
        return 0
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return 1


def _wait_until(process: subprocess.Popen[bytes], reached: Callable[[], bool]) -> None:
    """Poll ``reached`` every 50 ms until it holds or the program has ended."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while process.poll() is None and not reached() and time.monotonic() < deadline:
        time.sleep(0.05)


def _kill_when(
    process: subprocess.Popen[bytes],
    reached: Callable[[], bool],
    delay: float,
    at_latest: Callable[[], bool] | None = None,
) -> int:
    """SIGKILL the process group ``delay`` seconds after ``reached()`` first holds, so that
    kills land in every part of the program's work, not mostly in a JVM's start, or as soon
    as ``at_latest()`` holds if that comes first (a point of the work still well before its
    end, so that a program that got faster is still killed mid-work); 1 if the kill landed
    on a running program."""
    _wait_until(process, reached)
    if at_latest is None:
        return _kill_after(process, delay)
    deadline = time.monotonic() + delay
    _wait_until(process, lambda: at_latest() or time.monotonic() >= deadline)
    return _kill_after(process, 0)


def _lease_reached(broker: poisonq.Broker, consumer: str, number: int) -> Callable[[], bool]:
    def reached() -> bool:
        lease = broker.lease("orders", consumer)
        return lease is not None and lease.number >= number

    return reached


def _finish(argv: list[str], work: Path, name: str) -> None:
    """Run a program to its end; a failure is the scenario's failure."""
    _await(_start(argv, work, name), work, name)


def _await(process: subprocess.Popen[bytes], work: Path, name: str) -> None:
    """Wait for a program started as ``name`` to end; a failure (or a program still running
    after ``RUN_TIMEOUT``) is the scenario's failure, with the end of its stderr."""
    try:
        code = process.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    if code != 0:
        tail = (work / f"{name}.err").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the {name} program exited {code}:\n{tail}")


def _run_until_drained(broker: poisonq.Broker, argv: list[str], work: Path, pause: float) -> None:
    """Run a program again until the queue holds nothing, waiting ``pause`` (the lock of
    what the killed program held) between runs. A streaming query that stops keeps its
    last lease until it runs again: a run within the lock completes it."""
    for attempt in range(5):
        _finish(argv, work, f"rerun{attempt}")
        counts = broker.counts("orders")
        if not counts["locked"] + counts["active"]:
            return
        time.sleep(pause)


def _handled(log: Path) -> list[str]:
    """The messages a handler log says were handled well (a ``Processor``'s output)."""
    return [line.split()[1] for line in log.read_text().splitlines() if line[:2] == "D "]


def send_orders(
    broker: poisonq.Broker, queue: str, count: int, crash: int = 0, first_crash: int | None = None
) -> tuple[set[str], dict[str, str]]:
    """Send ``count`` orders (every ``BAD_EVERY``-th bad, and ``crash`` that kill their
    handler, spread from ``first_crash``, a third of the way by default); returns the good
    message ids and the reason each bad one must end with."""
    kinds = {n: "bad" for n in range(BAD_EVERY // 2, count, BAD_EVERY)}
    start = count // 3 if first_crash is None else first_crash
    kinds.update({n: "crash" for n in range(start, count, count // max(crash, 1))[:crash]})
    messages = [children.order(n, kinds.get(n, "good")) for n in range(count)]
    for start in range(0, count, 1000):
        broker.sender(queue).send(messages[start : start + 1000])
    reasons = {"bad": "PermanentError", "crash": "MaxDeliveryCountExceeded"}
    bad = {f"m{n}": reasons[kind] for n, kind in kinds.items()}
    return {f"m{n}" for n in range(count)} - bad.keys(), bad


def producer(store: Store, work: Path, rng: Random) -> Verdict:
    """A producer killed in the middle of its sends: every batch is there whole or not at
    all, and every batch whose send returned is there."""
    batches, size = 3000, 100
    url = store.url
    with poisonq.connect(url) as broker:
        broker.create_queue("orders")
        process = _start([*CHILDREN, "produce", url, "orders", str(batches), str(size)], work, "p")
        faults = _kill_after(process, rng.uniform(0.3, 3.0))
        printed = (work / "p.out").read_text()
        acknowledged = {int(line) for line in printed.splitlines(keepends=True) if "\n" in line}
        stored = Counter(_held_ids(broker, "orders"))
        per_batch = Counter(int(m[1:]) // size for m in stored)
        verdict = Verdict(faults=faults, balanced=broker.audit().ok)
        verdict.duplicated = sorted(m for m, n in stored.items() if n > 1)
        torn = [b for b, n in per_batch.items() if n != size]
        missing = acknowledged - per_batch.keys()
        verdict.lost = [f"batch {b}" for b in sorted({*torn, *missing})]
        return verdict


def _held_ids(broker: poisonq.Broker, queue: str) -> list[str]:
    """The message ids the queue holds, in order."""
    held: list[str] = []
    after = 0
    while page := broker.peek(queue, from_sequence=after, max_messages=5000):
        held += [m.message_id for m in page]
        after = page[-1].sequence_number + 1
    return held


def _committed_ids(path: Path) -> list[str]:
    """The ``message_id`` column of the files Spark's file sink committed (listed in its
    ``_spark_metadata`` log, as Spark's own reader takes them): a killed batch may leave
    files the log never names."""
    batches = {int(p.name.split(".")[0]): p for p in (path / "_spark_metadata").glob("[0-9]*")}
    # A compact file holds every entry up to its batch; the batches after it add theirs.
    compact = max((n for n, p in batches.items() if p.suffix == ".compact"), default=-1)
    files: list[str] = []
    for n in sorted(n for n in batches if n >= compact):
        for line in batches[n].read_text().splitlines()[1:]:  # after the version line
            files.append(json.loads(line)["path"].removeprefix("file://"))
    if not files:
        return []
    table = ds.dataset(files, format="parquet").to_table(["message_id"])
    return [str(m) for m in table.column("message_id").to_pylist()]


def source(store: Store, work: Path, rng: Random) -> Verdict:
    """A plain streaming query (the source into Parquet files) killed at any moment of its
    batches, then started again from its checkpoint until the queue is drained: the sink's
    commit log and the source's leases write every message once. The kill lands within the
    first eight batches of sixteen, so that it comes before the end however fast the
    machine runs them."""
    output, checkpoint = work / "out", work / "checkpoint"
    url = store.url
    with poisonq.connect(url) as broker:
        broker.create_queue("orders")
        good = {f"m{n}" for n in range(4000)}
        broker.sender("orders").send([children.order(n) for n in range(4000)])
        argv = [*CHILDREN, "sink", url, "orders", str(output), str(checkpoint)]
        reached = _lease_reached(broker, "chaos", rng.randrange(1, 9))
        faults = _kill_when(_start(argv, work, "sink"), reached, rng.uniform(0, 1.5))
        _run_until_drained(broker, argv, work, pause=5)  # lockDuration
        verdict = check(broker, "orders", good, {}, _committed_ids(output))
        verdict.faults = faults
        return verdict


def writer(store: Store, work: Path, rng: Random) -> Verdict:
    """A ``df.write.format("poisonq")`` killed while its partitions are being sent, then run
    again: with message ids and duplicate detection, every row is in the queue once."""
    count = 40_000
    url = store.url
    with poisonq.connect(url) as broker:
        broker.create_queue("orders", requires_duplicate_detection=True)
        argv = [*CHILDREN, "write", url, "orders", str(count)]
        sent = rng.randrange(count)
        faults = _kill_when(
            _start(argv, work, "write"),
            lambda: broker.counts("orders")["active"] >= sent,
            rng.uniform(0, 0.5),
        )
        _finish(argv, work, "rerun")
        verdict = check(
            broker, "orders", {f"m{n}" for n in range(count)}, {}, _held_ids(broker, "orders")
        )
        verdict.held = 0  # the rows are sent to stay in the queue
        verdict.faults = faults
        return verdict


def processor(store: Store, work: Path, rng: Random) -> Verdict:
    """``Processor`` workers killed at any moment, then run again until the queue is drained
    (the dead workers' locks expire first)."""
    url = store.url
    with poisonq.connect(url) as broker:
        broker.create_queue("orders", max_delivery_count=3, lock_duration=2)
        good, bad = send_orders(broker, "orders", 4000)
        log = work / "handled.log"
        argv = [*CHILDREN, "process", url, "orders", str(log)]
        done = rng.randrange(3500)
        faults = _kill_when(
            _start(argv, work, "processor"),
            lambda: broker.counts("orders")["completed"] >= done,
            rng.uniform(0, 0.3),
        )
        _run_until_drained(broker, argv, work, pause=2)  # the queue's lock
        verdict = check(broker, "orders", good, bad, None, broker.counts("orders")["completed"])
        verdict.faults = faults
        verdict.double_holders = double_holders(_holdings(log))
        return verdict


CRASHED = 3  # the exit code of a worker whose handler killed it (children.handle_order)


def supervise(broker: poisonq.Broker, argv: list[str], work: Path, queue: str = "orders") -> int:
    """Run a worker as a supervisor does: start it again each time it dies, and after it
    goes idle while the queue still holds messages (locks of a dead worker not yet run out),
    until the queue holds nothing. Returns how many times it died."""
    deaths = 0
    deadline = time.monotonic() + RUN_TIMEOUT
    for run in itertools.count():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the queue was not drained in {RUN_TIMEOUT} s")
        process = _start(argv, work, "worker")
        code = process.wait(timeout=RUN_TIMEOUT)
        if code == CRASHED:
            deaths += 1
            continue
        if code != 0:
            tail = (work / "worker.err").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"worker run {run} exited {code}:\n{tail}")
        counts = broker.counts(queue)
        if not counts["locked"] + counts["active"] + counts["scheduled"]:
            return deaths
        time.sleep(0.2)
    raise AssertionError("unreachable")


def crash_orders(
    url: str,
    work: Path,
    count: int,
    batch_size: int,
    first_crash: int,
    isolation: str = "none",
    concurrency: int = 1,
    crashers: int = 4,
) -> Verdict:
    """``count`` orders (1 % bad, ``crashers`` that kill their worker, spread from ``first_crash``)
    through a ``Processor`` of ``batch_size`` and ``concurrency`` threads on a queue of
    ``max_delivery_count=3``, the worker started again after each death until the queue is
    drained. ``faults`` counts the deaths."""
    with poisonq.connect(url) as broker:
        broker.create_queue("orders", max_delivery_count=3, lock_duration=1)
        good, bad = send_orders(broker, "orders", count, crash=crashers, first_crash=first_crash)
        argv = [*CHILDREN, "crash-process", url, "orders", str(batch_size), isolation]
        argv += [str(concurrency)]
        deaths = supervise(broker, argv, work)
        verdict = check(broker, "orders", good, bad, None, broker.counts("orders")["completed"])
        verdict.faults = deaths
        return verdict


def processor_crash(store: Store, work: Path, rng: Random) -> Verdict:
    """A ``Processor`` (batches of 50) whose handler kills its process on 4 of 2,000 orders,
    started again after each death: every crasher dead-lettered after its deliveries, and
    no good order dead-lettered (a suspect, delivered again after its lock ran out, runs
    alone). Where the crashers are in the queue is drawn from the run's seed."""
    return crash_orders(store.url, work, 2000, 50, first_crash=rng.randrange(500))


def _holdings(log: Path) -> list[Holding]:
    """The deliveries a handler log records, each known by its lock token: held until its
    handler was done, or else until its lock ran out. A torn last line is skipped."""
    started: dict[tuple[str, str], tuple[float, float]] = {}
    ended: dict[tuple[str, str], float] = {}
    for line in log.read_text().splitlines():
        match line.split():
            case ["S", message_id, token, start, until]:
                started[message_id, token] = (float(start), float(until))
            case ["E", message_id, token, end]:
                ended[message_id, token] = float(end)
    return [
        Holding(key[0], start, ended.get(key, until)) for key, (start, until) in started.items()
    ]


def output_ids(path: Path) -> list[str]:
    """The ``message_id`` column of every Parquet file under ``path`` (Spark's unfinished
    ``_temporary`` files and ``.crc`` files are ignored, as Spark's reader ignores them)."""
    if not path.exists():
        return []
    table = ds.dataset(path, format="parquet", partitioning="hive").to_table(["message_id"])
    return [str(m) for m in table.column("message_id").to_pylist()]


def pipeline(store: Store, work: Path, rng: Random) -> Verdict:
    """``poisonq pipeline run`` (a per-row function with the crash guard) killed with its JVM
    and Python workers at any moment of its batches, then run again to the end. The kill
    lands after the start of one of the first four leases (the orders take six, the
    crashers' later deliveries a few more), and at the latest when the lease two after it
    starts, so that it comes before the end however fast the machine runs the batches."""
    output = work / "out"
    url = store.url
    with poisonq.connect(url) as broker:
        broker.create_queue("orders", max_delivery_count=3)
        good, bad = send_orders(broker, "orders", 3000, crash=2)
        argv = _pipeline_argv(url, "pipeline", output)
        lease = rng.randrange(1, 5)
        faults = _kill_when(
            _start(argv, work, "pipeline"),
            _lease_reached(broker, "pipeline", lease),
            rng.uniform(0, 2.0),
            at_latest=_lease_reached(broker, "pipeline", lease + 2),
        )
        _finish(argv, work, "rerun")
        verdict = check(broker, "orders", good, bad, output_ids(output))
        verdict.faults = faults
        return verdict


def _pipeline_argv(url: str, consumer: str, output: Path) -> list[str]:
    return [
        *POISONQ, "--url", url, "pipeline", "run",
        f"{ROOT / 'tests' / 'chaos' / 'children.py'}:parse", "--consumer", consumer,
        "--queue", "orders", "--schema", children.ORDERS_SCHEMA, "--output", str(output),
        "--batch-size", "500", "--lock-duration", "20",
    ]  # fmt: skip


def shared(store: Store, work: Path, rng: Random) -> Verdict:
    """Two pipeline instances (consumers ``ingest-1`` and ``ingest-2``) and a ``Processor``
    on one queue at once, from separate processes; ``ingest-1`` is killed at any moment of
    its batches and run again. Each message is handled by exactly one of them."""
    output = work / "out"
    log = work / "handled.log"
    url = store.url
    with poisonq.connect(url) as broker:
        broker.create_queue("orders", max_delivery_count=3, lock_duration=20)
        good, bad = send_orders(broker, "orders", 20_000)
        first = _pipeline_argv(url, "ingest-1", output)
        killed = _start(first, work, "ingest-1")
        second = _start(_pipeline_argv(url, "ingest-2", output), work, "ingest-2")
        # The Processor starts once the pipelines have: it would drain the queue alone
        # while their JVMs start.
        _wait_until(killed, _lease_reached(broker, "ingest-1", 1))
        processor = _start([*CHILDREN, "process", url, "orders", str(log)], work, "processor")
        reached = _lease_reached(broker, "ingest-1", rng.randrange(2, 4))
        faults = _kill_when(killed, reached, rng.uniform(0, 2.0))
        _finish(first, work, "ingest-1-rerun")
        _await(second, work, "ingest-2")
        _await(processor, work, "processor")
        if broker.counts("orders")["active"]:  # arrived back after the others went idle
            _finish(first, work, "ingest-1-last")
        handled = _handled(log)
        idle = [c for c in ("ingest-1", "ingest-2") if not (output / f"consumer={c}").exists()]
        if idle or not handled:
            raise RuntimeError(f"not all at once: {idle or 'the Processor'} took no message")
        verdict = check(broker, "orders", good, bad, output_ids(output) + handled)
        verdict.faults = faults
        verdict.double_holders = double_holders(_holdings(log))
        return verdict


def outage(store: Store, work: Path, rng: Random) -> Verdict:
    """PostgreSQL stopped at once (as a crash: every connection cut) and started again while
    a producer, a pipeline and a ``Processor`` work on one queue: each rides it out with the
    client's retries, and no message is lost or handled twice (duplicate detection takes
    the batch a producer sends again when its commit was cut)."""
    assert store.server is not None, "the outage scenario restarts a PostgreSQL server"
    url, output, log = store.url, work / "out", work / "handled.log"
    with poisonq.connect(url) as broker:
        broker.create_queue(
            "orders", max_delivery_count=5, requires_duplicate_detection=True, lock_duration=30
        )  # a settlement retried over the outage lands within the lock
        good, bad = send_orders(broker, "orders", 4000)
        good |= {f"m{n}" for n in range(4000, 9000)}
        pipeline = _pipeline_argv(url, "ingest", output)
        programs = [
            _start([*CHILDREN, "produce", url, "orders", "100", "50", "4000"], work, "producer"),
            _start(pipeline, work, "pipeline"),
        ]
        _wait_until(programs[1], _lease_reached(broker, "ingest", 1))
        programs.append(_start([*CHILDREN, "process", url, "orders", str(log)], work, "processor"))
        time.sleep(rng.uniform(0, 3))
        store.server.restart(down_for=rng.uniform(0.5, 2.5))
        for program, name in zip(programs, ("producer", "pipeline", "processor"), strict=True):
            _await(program, work, name)  # each rode out the outage
        counts = broker.counts("orders")
        if counts["active"] + counts["locked"]:
            # Sent after the others went idle, or received by a call whose answer the outage
            # cut (retried, it received again): that lock runs out and they come again.
            _run_until_drained(broker, pipeline, work, pause=10)  # 30 s lock: a few runs
        handled = _handled(log)
        verdict = check(broker, "orders", good, bad, output_ids(output) + handled)
        verdict.faults = 1
        verdict.double_holders = double_holders(_holdings(log))
        return verdict


def streaming(store: Store, work: Path, rng: Random) -> Verdict:
    """A Structured Streaming query with ``foreach_batch`` killed at any moment, then started
    again from its checkpoint (at once, or after its lease's lock ran out) until the queue is
    drained. The kill lands within the first eight batches of sixteen."""
    output, checkpoint = work / "out", work / "checkpoint"
    url = store.url
    with poisonq.connect(url) as broker:
        broker.create_queue("orders", max_delivery_count=3)
        good, bad = send_orders(broker, "orders", 4000)
        bad = dict.fromkeys(bad, "ExpectationFailed")
        argv = [*CHILDREN, "stream", url, "orders", str(output), str(checkpoint)]
        reached = _lease_reached(broker, "chaos", rng.randrange(1, 9))
        faults = _kill_when(_start(argv, work, "stream"), reached, rng.uniform(0, 1.5))
        # Restarted within the lock, or after it ran out (as on a slow machine): either way
        # the replay is the killed batch under its batch id, and overwrites what it wrote.
        time.sleep(rng.choice([0.0, rng.uniform(5, 8)]))  # lockDuration is 5 s
        _run_until_drained(broker, argv, work, pause=5)  # lockDuration
        verdict = check(broker, "orders", good, bad, output_ids(output))
        verdict.faults = faults
        return verdict


SCENARIOS = [
    Scenario("producer", producer, ("sqlite", "postgresql")),
    Scenario("processor", processor, ("sqlite", "postgresql")),
    Scenario("processor-crash", processor_crash, ("sqlite", "postgresql")),
    Scenario("pipeline", pipeline, ("sqlite",), spark=True),
    Scenario("streaming", streaming, ("sqlite",), spark=True),
    Scenario("source", source, ("sqlite",), spark=True),
    Scenario("writer", writer, ("sqlite",), spark=True),
    Scenario("shared", shared, ("postgresql",), spark=True),
    Scenario("outage", outage, ("postgresql",), spark=True, alone=True),
]
