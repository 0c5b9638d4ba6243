"""Ctrl-C at a terminal stops a Processor without spending deliveries: a real process, a real
SIGINT, whichever thread it lands in (a handler's, or the main thread waiting for the pump
threads) and wherever the handler runs (in the process, or in the crash guard's child)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

import poisonq
from poisonq import Message
from tests.helpers import assert_balanced

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

WORKER = """
import sys, time, poisonq
url, concurrency, isolation = sys.argv[1], int(sys.argv[2]), sys.argv[3] or None
def handle(message):
    time.sleep(0.02)
with poisonq.connect(url) as broker:
    processor = poisonq.Processor(
        broker, "orders", handle, batch_size=50, concurrency=concurrency, isolation=isolation
    )
    try:
        processor.run(until_idle=True)
    except KeyboardInterrupt:
        sys.exit(130)
"""


@pytest.mark.parametrize(
    ("concurrency", "isolation"), [(1, ""), (2, ""), (2, "process")], ids=["1", "2", "2-process"]
)
def test_ctrl_c_leaves_nothing_locked_and_spends_no_delivery(
    url: str, concurrency: int, isolation: str
) -> None:
    with poisonq.connect(url) as broker:
        broker.create_queue("orders", max_delivery_count=1, lock_duration=30)
        broker.sender("orders").send([Message(body=f"m{n}") for n in range(1000)])
        # A shell's background job starts with Ctrl-C ignored, and its children inherit that.
        ctrl_c = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
        command = [sys.executable, "-c", WORKER, url, str(concurrency), isolation]
        with subprocess.Popen(command, stderr=subprocess.PIPE, preexec_fn=ctrl_c) as worker:
            deadline = time.monotonic() + 60
            while broker.counts("orders")["completed"] < 100:
                assert time.monotonic() < deadline and worker.poll() is None, "no progress"
                time.sleep(0.05)
            worker.send_signal(signal.SIGINT)
            _, stderr = worker.communicate(timeout=60)
        assert worker.returncode == 130, stderr.decode()
        counts = broker.counts("orders")
        assert counts["locked"] == 0 and counts["dead_lettered"] == 0
        assert counts["completed"] + counts["active"] == 1000
        left = broker.peek("orders", max_messages=1000)
        assert {m.delivery_count for m in left} == {0}
        assert_balanced(broker)
