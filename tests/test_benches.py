"""Every bench that ``make bench`` runs still runs, at a size that proves it works rather than
what it measures: it exits 0 and prints its machine-readable result lines (``key=value``
fields), the keys the docs quote among them. (A bench is run by hand, rarely: without this a
change of an API it calls is found the day someone needs its numbers.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMALL_QUEUE = ["--messages", "200", "--dead-letter", "100", "--rounds", "1"]

# (script, arguments, a key its result lines must print); "{pg}" is the test server's URL.
BENCHES = [
    ("queue_throughput", SMALL_QUEUE, "ratio_dlq_move"),
    ("queue_throughput", [*SMALL_QUEUE, "--url", "{pg}"], "pgmq_produce_msgs_per_s"),
    ("queue_floors", [*SMALL_QUEUE, "--url", "{pg}"], "pgmq_produce_msgs_per_s"),
    ("queue_floors", [*SMALL_QUEUE, "--sqlite"], "design=today-range"),
    (
        "aio_throughput",
        [
            *SMALL_QUEUE,
            *("--sessions", "5", "--session-messages", "2", "--concurrency", "10"),
            *("--async-messages", "40", "--sync-messages", "4", "--handler-wait", "0.01"),
            *("--transactions", "20", "--floor-rounds", "1"),
        ],
        "part=processor",
    ),
    (
        "async_store",
        ["--cycles", "20", "--rounds", "1", "--callers", "4", "--url", "{pg}"],
        "callers=",
    ),
    ("pipeline_throughput", ["--messages", "3000", "--batch", "1000"], "ms_per_crash"),
    ("sensor_events", ["--events", "2000", "--batch", "1000"], "batch="),
    ("pipeline_floors", ["--messages", "2000"], "="),
    ("lease_cycle", ["--messages", "1000", "--repeats", "1"], "lease_cycle_us_per_msg"),
    (
        "lease_cycle",
        ["--messages", "1000", "--repeats", "1", "--url", "{pg}"],
        "store=postgresql",
    ),
    ("failure_letters", ["--messages", "200", "--repeats", "1"], "lease_dead_letter_us"),
    (
        "failure_letters",
        ["--messages", "200", "--repeats", "1", "--url", "{pg}"],
        "store=postgresql",
    ),
    ("held_costs", ["--dead-letters", "1000", "--held", "5000", "--repeats", "1"], "="),
    (
        "store_growth",
        [*SMALL_QUEUE, "--held", "5000", "--dead-letters", "1000", "--lease", "1000"],
        "=",
    ),
    ("defect_ratio", ["--orders", "2000", "--seeds", "2"], "="),
    ("processor_isolation", ["--messages", "200", "--rounds", "1"], "="),
]


def result_lines(out: str) -> list[dict[str, str]]:
    """The lines made of ``key=value`` fields only, as dicts."""
    found = []
    for line in out.splitlines():
        fields = line.split()
        if fields and all("=" in field and not field.startswith("=") for field in fields):
            found.append(dict(field.split("=", 1) for field in fields))
    return found


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "arguments", "key"),
    BENCHES,
    ids=[f"{script}-{n}" for n, (script, _, _) in enumerate(BENCHES)],
)
def test_a_bench_of_make_bench_runs_and_prints_its_result_lines(
    script: str, arguments: list[str], key: str, pg_url: str, tmp_path: Path
) -> None:
    command = [sys.executable, str(ROOT / "bench" / f"{script}.py")]
    command += [argument.replace("{pg}", pg_url) for argument in arguments]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = result_lines(done.stdout)
    assert lines, done.stdout[-3000:]
    printed = " ".join(f"{k}={v}" for line in lines for k, v in line.items())
    assert key in printed, printed
