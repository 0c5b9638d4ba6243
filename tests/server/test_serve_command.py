"""``poisonq serve`` as an operator runs it: a real process on 127.0.0.1 that prints its URL
and the token it made, and answers the API with that token only."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from queue import Queue

import pytest

from poisonq import Broker, Message, RetryPolicy
from poisonq import connect as poisonq_connect
from poisonq.testing.pgserver import free_port


@pytest.fixture
def served(url: str, queue: str, broker: Broker) -> Iterator[tuple[str, str]]:
    """(base URL, token) of ``poisonq serve`` running on the test's store."""
    broker.sender(queue).send(Message(body="x"))
    port = free_port()
    poisonq = [sys.executable, "-c", "from poisonq.cli import main; main()"]
    command = [*poisonq, "--url", url, "serve", "--port", str(port)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        stderr = process.stderr
        lines: Queue[str] = Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in stderr], daemon=True).start()
        printed: list[str] = []
        while not any("Uvicorn running on" in line for line in printed):
            printed.append(lines.get(timeout=30))
        text = "".join(printed)
        address = re.search(r"serving at (http://127\.0\.0\.1:\d+)/ui/", text)
        token = re.search(r"token \(for writes and reads\): (\S+)", text)
        assert address and token, text
        assert address.group(1) == f"http://127.0.0.1:{port}"
        yield address.group(1), token.group(1)
    finally:
        process.terminate()
        process.wait(timeout=30)
        stderr.close()


def _get(address: str, token: str | None) -> urllib.request.Request:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return urllib.request.Request(address, headers=headers)


def test_serve_prints_its_url_and_token_and_needs_it(served: tuple[str, str]) -> None:
    base, token = served
    with urllib.request.urlopen(_get(f"{base}/api/queues/orders/counts", token)) as answer:
        assert json.load(answer)["active"] == 1
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(_get(f"{base}/api/queues/orders/counts", None))
    assert refused.value.code == 401
    refused.value.close()


def test_serve_on_a_port_in_use_says_so_in_one_line_before_any_banner(url: str, queue: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        poisonq = [sys.executable, "-c", "from poisonq.cli import main; main()"]
        command = [*poisonq, "--url", url, "serve", "--port", str(port)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("error: Invalid value for --port: cannot listen on 127.0.0.1 port")
    assert "Address already in use" in line
    assert "serving at" not in done.stderr and "token" not in done.stderr


@pytest.mark.parametrize("token", ["", "   ", "short"])
def test_a_token_too_short_to_guard_is_refused_in_one_line(
    url: str, queue: str, token: str
) -> None:
    """Before, ``--token ""`` started a server with a random token it did not print: nobody
    could log in."""
    poisonq = [sys.executable, "-c", "from poisonq.cli import main; main()"]
    command = [*poisonq, "--url", url, "serve", "--port", str(free_port()), "--token", token]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith("error: Invalid value for '--token': the token is ")
    assert "at least 16 characters" in line and "serving at" not in done.stderr


@pytest.mark.slow
def test_serve_lets_time_pass_where_nobody_reads(url: str) -> None:
    """Its housekeeping thread applies what is due everywhere: a poison message of a queue
    nobody reads reaches the dead-letter queue of the queue it rejects to (real time,
    bounded polling)."""
    with poisonq_connect(url) as broker:
        broker.create_queue("replies")
        reject = RetryPolicy(receive_retry_count=0, receive_error_handling="reject")
        broker.create_queue("orders", retry=reject, lock_duration=1)
        broker.sender("orders").send(Message(body="x", reply_to="replies"))
        broker.receiver("orders").receive()
        poisonq = [sys.executable, "-c", "from poisonq.cli import main; main()"]
        command = [*poisonq, "--url", url, "serve", "--port", str(free_port())]
        process = subprocess.Popen(
            [*command, "--housekeep-every", "0.2"], stderr=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + 30
            while broker.counts("replies/$deadletterqueue")["dead_lettered"] == 0:
                assert time.monotonic() < deadline, "the server applied nothing in 30 s"
                time.sleep(0.1)
        finally:
            process.terminate()
            process.wait(timeout=30)
        [rejected] = broker.peek("replies/$deadletterqueue")
        assert rejected.dead_letter_reason == "Rejected"
