"""The floors under the pipeline's speed on this machine, without poisonq's code in the way.

- SQLite: lock and then complete 100,000 messages durably (WAL, ``synchronous=FULL``) with bare
  SQL on poisonq's own schema: the least a store of per-message locks can cost per message.
- fork: one cycle of fork, exit and wait of a Python process, bare and after ``import
  poisonq.worker.child`` (what the crash guard's helper holds; a transform that refers to
  ``poisonq.PermanentError`` adds ``poisonq.errors``, which the guard has already): the least a
  crash that kills its process can cost.

And what the crash guard makes of that floor, on 100,000 rows shaped as lease rows, in calls
of 10,000 through :func:`poisonq.worker.guard.run_isolated`: ``guard_us_per_row``, what the
guard adds to a row without a crash (against :func:`~poisonq.worker.guard.run_inline`),
``guard_ms_per_crash``, the wall time a crash adds with one crashing row in 1,000, in one run,
and ``guard_ms_per_crash_failing``, the same with one row in 100 raising as well (as in
``bench/pipeline_throughput.py``), so that the child after each crash records a failure.
``guard_cpu_ms_per_crash`` and ``guard_cpu_ms_per_crash_failing`` are the same two in CPU
time, of the caller and of every process under it (the guard's helpers, with the children
they forked): on a machine shared with other work, the wall time of a run of 100 crashes
says mostly what the other work did, its CPU time what the crashes cost.

And ``map_batches=`` after a crash: the executor's side of it (the function of
``bench/pipeline_throughput.py``, 1 % of orders invalid) over 20,000 lease rows in chunks of
10,000, in the Python worker as a run goes before any crash (``map_batches_msgs_per_s``), and
under the crash guard, as it goes for the rest of a run once a message crashed a worker, with
one crashing order in each chunk (``map_batches_after_a_crash_msgs_per_s``; their ratio is
``after_a_crash_ratio``).

Prints two lines: ``sqlite_lock_complete_us_per_msg=… fork_cycle_ms_bare=…
fork_cycle_ms_poisonq=… guard_us_per_row=… guard_ms_per_crash=…
guard_ms_per_crash_failing=… guard_cpu_ms_per_crash=… guard_cpu_ms_per_crash_failing=…``
and ``map_batches_msgs_per_s=… map_batches_after_a_crash_msgs_per_s=…
after_a_crash_ratio=…``.
"""

from __future__ import annotations

import argparse
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from process_memory import _descendants

FORK_CYCLES = 300
TICK = os.sysconf("SC_CLK_TCK")
_FORK_LOOP = f"""
import gc, os, sys, time
if sys.argv[1:]:
    import poisonq.worker.child  # what the crash guard's helper loads
gc.freeze()
started = time.perf_counter()
for _ in range({FORK_CYCLES}):
    pid = os.fork()
    if pid == 0:
        os._exit(1)
    os.waitpid(pid, 0)
print((time.perf_counter() - started) / {FORK_CYCLES} * 1e3)
"""


def sqlite_floor(count: int) -> float:
    """Microseconds per message to lock ``count`` messages and complete them."""
    schema = resources.files("poisonq.store").joinpath("migrations/sqlite/0001_initial.sql")
    with tempfile.TemporaryDirectory() as work:
        db = sqlite3.connect(Path(work) / "floor.db", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(schema.read_text())
        db.execute(
            "INSERT INTO entities (id, name, options, created_at, updated_at)"
            " VALUES (1, 'orders', '{}', 0, 0)"
        )
        body = b'{"order_id": 123456, "customer": "C01234", "amount": 12.3}'
        db.execute("BEGIN")
        db.executemany(
            "INSERT INTO bodies (id, body) VALUES (?, ?)", ((n, body) for n in range(1, count + 1))
        )
        db.executemany(
            "INSERT INTO messages (entity_id, state, message_id, body_id, size, enqueued_at)"
            " VALUES (1, 'active', ?, ?, 60, 0)",
            ((str(n), n) for n in range(1, count + 1)),
        )
        db.execute("COMMIT")
        started = time.perf_counter()
        db.execute("BEGIN IMMEDIATE")
        db.execute(
            "UPDATE messages SET state = 'locked', lock_token = 't', locked_until = 1e12,"
            " delivery_count = delivery_count + 1 WHERE seq IN (SELECT seq FROM messages"
            " WHERE entity_id = 1 AND state = 'active' ORDER BY seq LIMIT ?) RETURNING seq",
            (count,),
        ).fetchall()
        db.execute("COMMIT")
        db.execute("BEGIN IMMEDIATE")
        db.execute(
            "DELETE FROM messages WHERE entity_id = 1 AND state = 'locked' AND lock_token = 't'"
            " AND seq BETWEEN 1 AND ? RETURNING body_id",
            (count,),
        ).fetchall()
        db.execute("DELETE FROM bodies WHERE id BETWEEN 1 AND ?", (count,))
        db.execute("COMMIT")
        elapsed = time.perf_counter() - started
        db.close()
    return elapsed / count * 1e6


def fork_cycle(*modules: str) -> float:
    """Milliseconds per fork, exit and wait, in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", _FORK_LOOP, *modules], capture_output=True, text=True, check=True
    )
    return float(out.stdout)


def _lease_row(n: int) -> tuple[Any, ...]:
    """A row shaped as the store's lease rows are (see ``LEASE_COLUMNS``)."""
    body = b'{"order_id": %d, "customer": "C01234", "amount": 12.3, "kind": "ok"}' % n
    return (n, str(n), body, None, None, "{}", None, None, 1.7e9, 1)


def _crashes_on_7(row: tuple[Any, ...]) -> dict[str, Any]:
    if row[0] % 1000 == 7:
        os._exit(1)
    return {"n": row[0]}


def _clean(row: tuple[Any, ...]) -> dict[str, Any]:
    return {"n": row[0]}


def _fails_on_0(row: tuple[Any, ...]) -> dict[str, Any]:
    if row[0] % 100 == 0:
        raise ValueError(f"order {row[0]}: unknown customer")
    return {"n": row[0]}


def _fails_on_0_crashes_on_7(row: tuple[Any, ...]) -> dict[str, Any]:
    if row[0] % 1000 == 7:
        os._exit(1)
    return _fails_on_0(row)


def tree_cpu() -> float:
    """CPU seconds of this process and of the processes under it that are alive, each with
    the children it has waited for (a helper's dead children), from ``/proc``."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    seconds = usage.ru_utime + usage.ru_stime
    for pid in _descendants(os.getpid())[1:]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        seconds += sum(int(ticks) for ticks in fields[11:15]) / TICK  # utime to cstime
    return seconds


def guard_costs(rows: int = 100_000) -> tuple[float, float, float, float, float]:
    """Microseconds the guard adds to a row on the clean path (against the same rows run in
    the caller), and milliseconds a crashing row adds (one in 1,000), without and with one
    row in 100 raising, in wall time, then in CPU time: the guard alone, in calls of 10,000
    rows as the pipeline makes them (median of three runs each way)."""
    from poisonq.worker.guard import Crashed, run_inline, run_isolated

    data = [_lease_row(n) for n in range(rows)]
    calls = [data[start : start + 10_000] for start in range(0, rows, 10_000)]
    for transform in (_clean, _crashes_on_7, _fails_on_0, _fails_on_0_crashes_on_7):
        run_isolated(transform, data[:10], ())  # start the helpers

    def seconds(transform: Callable[[tuple[Any, ...]], dict[str, Any]]) -> tuple[float, float]:
        started, cpu = time.perf_counter(), tree_cpu()
        for call in calls:
            run_isolated(transform, call, ())
        return time.perf_counter() - started, tree_cpu() - cpu

    crashed = sum(isinstance(r, Crashed) for r in run_isolated(_crashes_on_7, data, ()))
    per_row, per_crash, per_crash_failing, cpu_crash, cpu_crash_failing = [], [], [], [], []
    for _ in range(3):
        started = time.perf_counter()
        for call in calls:
            run_inline(_clean, call, ())
        inline = time.perf_counter() - started
        clean, clean_cpu = seconds(_clean)
        crashing, crashing_cpu = seconds(_crashes_on_7)
        failing, failing_cpu = seconds(_fails_on_0)
        failing_crashing, failing_crashing_cpu = seconds(_fails_on_0_crashes_on_7)
        per_row.append((clean - inline) / rows * 1e6)
        per_crash.append((crashing - clean) / crashed * 1e3)
        per_crash_failing.append((failing_crashing - failing) / crashed * 1e3)
        cpu_crash.append((crashing_cpu - clean_cpu) / crashed * 1e3)
        cpu_crash_failing.append((failing_crashing_cpu - failing_cpu) / crashed * 1e3)
    median = statistics.median
    return (
        median(per_row),
        median(per_crash),
        median(per_crash_failing),
        median(cpu_crash),
        median(cpu_crash_failing),
    )


def map_batches_after_a_crash(rows: int = 20_000) -> tuple[float, float]:
    """Messages per second through the executor side of ``map_batches=`` (the bench's
    ``batch_transform``, 1 % of orders invalid) in lease chunks of 10,000: in the Python
    worker, as a run goes before any crash, and under the crash guard, as it goes for the
    rest of a run once a message crashed its worker, with one crashing order in each chunk
    (median of three each way)."""
    from pipeline_throughput import batch_transform
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    from poisonq.spark.batches import BatchTransform
    from poisonq.spark.rows import OutputSchema

    def order(n: int) -> tuple[Any, ...]:
        kind = "crash" if n % 10_000 == 4_321 else "invalid" if n % 100 == 0 else "ok"
        body = b'{"order_id": %d, "customer": "C01234", "amount": 12.3, "kind": "%s"}' % (
            n,
            kind.encode(),
        )
        return (n, str(n), body, None, None, "{}", None, None, 1.7e9, 1)

    data = [order(n) for n in range(rows)]
    clean = [row for row in data if b'"crash"' not in row[2]]
    fields = [("order_id", LongType()), ("customer", StringType()), ("amount", DoubleType())]
    output = OutputSchema(StructType([StructField(name, kind) for name, kind in fields]))

    def rate(isolate: bool, lease: list[tuple[Any, ...]]) -> float:
        work = BatchTransform(output, (), isolate, None, batch_transform)
        started = time.perf_counter()
        for start in range(0, len(lease), 10_000):
            work.apply(lease[start : start + 10_000], "token", [])
        return len(lease) / (time.perf_counter() - started)

    rate(True, data[:10_000])  # the guard's helper started
    in_worker = statistics.median(rate(False, clean) for _ in range(3))
    guarded = statistics.median(rate(True, data) for _ in range(3))
    return in_worker, guarded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    args = parser.parse_args()
    us_per_row, ms_per_crash, ms_per_crash_failing, cpu_crash, cpu_crash_failing = guard_costs()
    print(
        f"sqlite_lock_complete_us_per_msg={sqlite_floor(args.messages):.1f}"
        f" fork_cycle_ms_bare={fork_cycle():.2f}"
        f" fork_cycle_ms_poisonq={fork_cycle('poisonq'):.2f}"
        f" guard_us_per_row={us_per_row:.2f} guard_ms_per_crash={ms_per_crash:.2f}"
        f" guard_ms_per_crash_failing={ms_per_crash_failing:.2f}"
        f" guard_cpu_ms_per_crash={cpu_crash:.2f}"
        f" guard_cpu_ms_per_crash_failing={cpu_crash_failing:.2f}"
    )
    in_worker, guarded = map_batches_after_a_crash()
    print(
        f"map_batches_msgs_per_s={in_worker:.0f}"
        f" map_batches_after_a_crash_msgs_per_s={guarded:.0f}"
        f" after_a_crash_ratio={guarded / in_worker:.2f}"
    )


if __name__ == "__main__":
    main()
