"""``poisonq serve`` as an operator runs it: a real process on 127.0.0.1 that prints its URL
and where the token it made is (a file only its user reads), and answers the API with that
token only."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import sqlite3
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from queue import Queue

import pytest

import poisonq
from poisonq import Broker, Message, RetryPolicy
from poisonq.testing.pgserver import free_port

# Each test starts `poisonq serve` in a process of its own: the fast tier leaves them out.
pytestmark = pytest.mark.slow


@contextlib.contextmanager
def serving(url: str, *options: str) -> Iterator[tuple[str, str]]:
    """(base URL, what it printed up to uvicorn's banner) of ``poisonq serve`` on ``url``."""
    port = free_port()
    poisonq = [sys.executable, "-c", "from poisonq.cli import main; main()"]
    command = [*poisonq, "--url", url, "serve", "--port", str(port), *options]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    stderr = process.stderr
    try:
        lines: Queue[str] = Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in stderr], daemon=True).start()
        printed: list[str] = []
        while not any("Uvicorn running on" in line for line in printed):
            printed.append(lines.get(timeout=30))
        text = "".join(printed)
        address = re.search(r"serving at (http://127\.0\.0\.1:\d+)/ui/", text)
        assert address and address.group(1) == f"http://127.0.0.1:{port}", text
        yield address.group(1), text
    finally:
        process.terminate()
        process.wait(timeout=30)
        stderr.close()


def _token_file(printed: str) -> Path:
    written = re.search(r"token \(for writes and reads\) in (\S+)", printed)
    assert written, printed
    return Path(written.group(1))


@pytest.fixture
def served(url: str, queue: str, broker: Broker) -> Iterator[tuple[str, str]]:
    """(base URL, token) of ``poisonq serve`` running on the test's store."""
    broker.sender(queue).send(Message(body="x"))
    with serving(url) as (base, printed):
        yield base, _token_file(printed).read_text().strip()


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


def _refused(url: str, *options: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """``poisonq serve`` with ``options``, which it refuses at start: what it did, and the one
    line it printed."""
    poisonq = [sys.executable, "-c", "from poisonq.cli import main; main()"]
    command = [*poisonq, "--url", url, "serve", "--port", str(free_port()), *options]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    return done, line


@pytest.mark.parametrize("token", ["", "   ", "short"])
def test_a_token_too_short_to_guard_is_refused_in_one_line(
    url: str, queue: str, token: str
) -> None:
    """A token shorter than 16 characters (``--token ""`` included) is refused in one line
    before the server starts: a server nobody can log in to is never started."""
    done, line = _refused(url, "--token", token)
    assert line.startswith("error: Invalid value for '--token': the token is ")
    assert "at least 16 characters" in line and "serving at" not in done.stderr


def test_a_token_made_at_start_is_in_a_file_only_its_user_reads_removed_at_stop(
    url: str, queue: str
) -> None:
    """Not printed: a terminal's scrollback and the journal keep what ``serve`` prints."""
    with serving(url) as (base, printed):
        token_file = _token_file(printed)
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 32 and token not in printed
        with urllib.request.urlopen(_get(f"{base}/api/queues/orders/counts", token)) as answer:
            assert answer.status == 200
    assert not token_file.exists()


def _written(token_file: Path, mode: int) -> Path:
    token_file.write_text(f"{FILE_TOKEN}\n")
    token_file.chmod(mode)
    return token_file


FILE_TOKEN = "from-a-file-0123456789"


def test_the_token_can_come_from_a_file_only_its_owner_reads(
    url: str, queue: str, tmp_path: Path
) -> None:
    token_file = _written(tmp_path / "token", 0o600)
    with serving(url, "--token-file", str(token_file)) as (base, printed):
        assert "token" not in printed.replace("--token-file", "")
        with urllib.request.urlopen(_get(f"{base}/api/queues/orders/counts", FILE_TOKEN)) as answer:
            assert answer.status == 200
    assert token_file.exists()  # the operator's file stays


def test_a_token_file_others_can_read_is_refused_in_one_line(
    url: str, queue: str, tmp_path: Path
) -> None:
    token_file = _written(tmp_path / "token", 0o644)
    poisonq = [sys.executable, "-c", "from poisonq.cli import main; main()"]
    command = [
        *poisonq,
        "--url",
        url,
        "serve",
        "--port",
        str(free_port()),
        "--token-file",
        str(token_file),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "can be read by others (mode 644): chmod 600 it" in line
    assert FILE_TOKEN not in done.stderr


def test_forwarded_allow_ips_must_be_addresses(url: str, queue: str) -> None:
    poisonq = [sys.executable, "-c", "from poisonq.cli import main; main()"]
    command = [*poisonq, "--url", url, "serve", "--forwarded-allow-ips", "10.0.0.1,proxy"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "'proxy' is not an address or network" in done.stderr


def test_serve_warns_of_an_entity_named_before_dot_segments_were_refused(tmp_path: Path) -> None:
    """A store made before the rule may hold ``x/../admin``: it is still listed, scraped
    and deleted by its name, and ``serve`` names it at start."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    with poisonq.connect(url) as broker:
        broker.create_queue("x-up-admin")
        broker.sender("x-up-admin").send(Message(body="kept"))
    with sqlite3.connect(tmp_path / "old.db") as db:  # as a store of the old rule holds it
        db.execute("UPDATE entities SET name = replace(name, 'x-up-admin', 'x/../admin')")
    token = "a-token-of-sixteen-or-more"
    with serving(url, "--token", token) as (base, printed):
        warnings = [line for line in printed.splitlines() if line.startswith("warning:")]
        assert warnings == [
            "warning: 'x/../admin' has a '.' or '..' segment, which clients that normalise"
            " paths do not send as it is: move its messages to a queue with another name"
        ]
        with urllib.request.urlopen(_get(f"{base}/metrics", token)) as answer:
            assert 'queue="x/../admin"' in answer.read().decode()
    with poisonq.connect(url) as broker:
        assert broker.counts("x/../admin")["active"] == 1
        broker.delete_queue("x/../admin")
        assert broker.entities() == []


@pytest.mark.slow
def test_serve_lets_time_pass_where_nobody_reads(url: str) -> None:
    """Its housekeeping thread applies what is due everywhere: a poison message of a queue
    nobody reads reaches the dead-letter queue of the queue it rejects to (real time,
    bounded polling)."""
    with poisonq.connect(url) as broker:
        broker.create_queue("replies")
        reject = RetryPolicy(receive_retry_count=0, receive_error_handling="reject")
        broker.create_queue("orders", retry=reject, lock_duration=1)
        broker.sender("orders").send(Message(body="x", reply_to="replies"))
        broker.receiver("orders").receive()
        cli = [sys.executable, "-c", "from poisonq.cli import main; main()"]
        command = [*cli, "--url", url, "serve", "--port", str(free_port())]
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


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("/ui/", "not an absolute http or https URL"),
        ("poisonq.example.com", "not an absolute http or https URL"),
        ("ftp://x", "not an absolute http or https URL"),
        ("https://x/?a=1", "not an absolute http or https URL"),
        ("https://exa mple.com", "has a space in its host"),
        ("https://user:pw@example.com", "carries a user or password"),
        ("https://example.com/poisonq", "has a path"),
    ],
)
def test_a_public_url_alerts_could_not_open_or_should_not_publish_is_refused_in_one_line(
    url: str, queue: str, given: str, why: str
) -> None:
    """The public URL is the scheme and host of every alert's link, published on
    ``/metrics``: a relative one, one with a path the UI is not served under, or one with a
    password in it is refused in one line saying which."""
    _, line = _refused(url, "--public-url", given)
    assert line.startswith("error: Invalid value for '--public-url': ")
    assert why in line


def test_serve_says_where_alerts_link(url: str, queue: str) -> None:
    given = "https://poisonq.example.com/"
    with serving(url, "--public-url", given, "--open-reads") as (base, printed):
        assert "alerts link https://poisonq.example.com/ui/" in printed
        with urllib.request.urlopen(f"{base}/metrics") as answer:
            metrics = answer.read().decode()
    assert 'poisonq_ui_info{url="https://poisonq.example.com/ui/"} 1.0' in metrics
