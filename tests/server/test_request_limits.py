"""What a hostile client costs the real server (uvicorn on 127.0.0.1, raw sockets): bodies
past their limit are refused as they stream in and the rest is never read, slow headers and
bodies are cut off at the read timeout, a client that leaves mid-body is one quiet line, and
proxy headers are believed only from the addresses the operator names. Every loop here is
bounded in count, and every wait by a socket timeout."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from poisonq import Broker
from poisonq.server import create_app
from poisonq.server.background import BackgroundServer
from poisonq.server.guard import RequestLimits
from poisonq.server.sessions import SESSION_COOKIE
from poisonq.server.throttle import LIMIT
from tests.server.conftest import TOKEN

WAIT = 20.0  # seconds any one socket operation may take before the test fails
LIMITS = RequestLimits(read_timeout=1.0)


@pytest.fixture
def server(broker: Broker, queue: str) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(broker, token=TOKEN, limits=LIMITS)) as running:
        yield running


def connect(server: BackgroundServer) -> socket.socket:
    parts = urlsplit(server.url)
    assert parts.hostname == "127.0.0.1" and parts.port
    opened = socket.create_connection((parts.hostname, parts.port), timeout=WAIT)
    return opened


def answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def request(method: str, path: str, *headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers, "", ""]
    return "\r\n".join(lines).encode()


def test_a_declared_body_past_the_limit_is_refused_before_a_byte_of_it_is_read(
    server: BackgroundServer,
) -> None:
    with connect(server) as sock:
        sock.sendall(request("POST", "/ui/login", f"Content-Length: {400 * 2**20}"))
        got = answer(sock)  # no body sent at all: the answer and the close come first
    assert got.startswith(b"HTTP/1.1 413 ")
    assert b"connection: close" in got.lower() and b"RequestTooLarge" in got


@pytest.mark.parametrize(
    ("path", "token", "limit"),
    [
        ("/ui/login", None, LIMITS.form_bytes),
        ("/api/queues/orders/messages", None, LIMITS.form_bytes),
        ("/api/queues/orders/messages", "a-wrong-token-of-some-length", LIMITS.form_bytes),
        ("/api/queues/orders/messages", TOKEN, LIMITS.send_bytes),
    ],
)
def test_a_streamed_body_is_cut_off_once_past_its_limit_and_the_rest_never_read(
    server: BackgroundServer, path: str, token: str | None, limit: int
) -> None:
    """A chunked body of up to 300 MB: the server answers 413 and closes once the body
    passes the limit, so the client cannot send much more than socket buffers hold. A send
    has the larger limit only with the right token."""
    chunk = b"x" * 65536
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    with connect(server) as sock:
        auth = [f"Authorization: Bearer {token}"] if token else []
        sock.sendall(request("POST", path, "Transfer-Encoding: chunked", *auth))
        with pytest.raises(OSError):  # reset or broken pipe: the server has closed
            for _ in range(300 * 2**20 // len(chunk)):
                sock.sendall(framed)
                sent += len(chunk)
        try:
            got = answer(sock)
        except OSError:
            got = b""  # the reset came before the answer was read
    assert got == b"" or got.startswith(b"HTTP/1.1 413 "), got
    assert limit <= sent < limit + 32 * 2**20


@pytest.mark.slow
def test_a_body_that_trickles_in_is_refused_at_the_read_timeout(
    server: BackgroundServer,
) -> None:
    with connect(server) as sock:
        sock.sendall(request("POST", "/ui/login", "Content-Length: 100") + b"token=")
        got = answer(sock)  # the rest never comes
    assert got.startswith(b"HTTP/1.1 408 ") and b"RequestTimeout" in got


@pytest.mark.slow
def test_headers_that_trickle_in_end_the_connection_at_the_read_timeout(
    server: BackgroundServer,
) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET /ui/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        assert answer(sock) == b""  # closed, no request ever started
    with connect(server) as sock:  # the next request on a kept-alive connection too
        sock.sendall(request("GET", "/ui/login") + b"GET /ui/ HTTP/1.1\r\nHost: 1")
        got = answer(sock)
    assert got.startswith(b"HTTP/1.1 200 ") and got.count(b"HTTP/1.1 ") == 1


def test_clients_that_leave_mid_body_are_one_quiet_line_each(
    server: BackgroundServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    clients = 50
    socks = [connect(server) for _ in range(clients)]
    for sock in socks:
        sock.sendall(request("POST", "/ui/purge", "Content-Length: 1000") + b"queue=or")
    # Each answered request is one line: a login page, fetched on a fresh connection, says
    # the server has taken in every request before them (it serves them in order).
    with connect(server) as probe:
        probe.sendall(request("GET", "/ui/login", "Connection: close"))
        assert answer(probe).startswith(b"HTTP/1.1 200 ")
    for sock in socks:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # a reset, mid-body

    def counted() -> int:
        return sum("went away before its body arrived" in r.getMessage() for r in caplog.records)

    for _ in range(int(WAIT / 0.05)):  # the server notices each reset on its own time
        if counted() == clients:
            break
        time.sleep(0.05)
    assert counted() == clients
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def _guesses(server: BackgroundServer, forwarded_for: bool) -> list[int]:
    statuses = []
    for n in range(3 * LIMIT):
        with connect(server) as sock:
            headers = ["Authorization: Bearer wrong-wrong-wrong-wrong", "Connection: close"]
            if forwarded_for:
                headers.append(f"X-Forwarded-For: 10.1.{n}.1")
            sock.sendall(request("GET", "/api/queues/orders/counts", *headers))
            statuses.append(int(answer(sock).split(b" ", 2)[1]))
    return statuses


def test_forwarded_for_from_a_client_not_named_does_not_start_it_clean(
    server: BackgroundServer,
) -> None:
    """By default no address is a proxy: a guesser cannot claim a new address per guess."""
    assert _guesses(server, forwarded_for=True) == [401] * LIMIT + [429] * (2 * LIMIT)


def test_a_proxy_named_is_believed_for_the_client_and_the_scheme(
    broker: Broker, queue: str
) -> None:
    """Behind a proxy the operator names, each address the proxy reports is a client of its
    own, and ``X-Forwarded-Proto: https`` makes the session cookie ``Secure``."""
    app = create_app(broker, token=TOKEN, limits=LIMITS)
    with BackgroundServer(app, forwarded_allow_ips="127.0.0.1") as server:
        assert _guesses(server, forwarded_for=True) == [401] * (3 * LIMIT)
        body = f"token={TOKEN}&operator=ann&next=/ui/".encode()
        for proto, secure in (("https", True), ("http", False)):
            with connect(server) as sock:
                sock.sendall(
                    request(
                        "POST",
                        "/ui/login",
                        f"X-Forwarded-Proto: {proto}",
                        f"Origin: {proto}://127.0.0.1",
                        "Content-Type: application/x-www-form-urlencoded",
                        f"Content-Length: {len(body)}",
                        "Connection: close",
                    )
                    + body
                )
                got = answer(sock).decode()
            assert got.startswith("HTTP/1.1 303 "), got
            [cookie] = [line for line in got.splitlines() if SESSION_COOKIE in line]
            assert ("; secure" in cookie.lower()) is secure
