"""``poisonq serve``: the HTTP API, the web UI and ``/metrics`` in one process."""

from __future__ import annotations

import contextlib
import copy
import ipaddress
import os
import signal
import socket
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click

from poisonq.cli.app import App
from poisonq.cli.housekeeping import keep_time
from poisonq.cli.paths import PathParam
from poisonq.limits import FORM_BYTES, READ_TIMEOUT, SEND_BYTES
from poisonq.names import dot_segments, parse_address

# Seconds between the server's housekeeping passes: an alert on a queue's status or depth
# sees time pass within a scrape interval, and a pass that finds nothing due is one read.
HOUSEKEEP_EVERY = 5.0


def _check_port(host: str, port: int) -> None:
    """Bind the address once before anything is printed: a port in use (or an address not
    of this machine) is one clear line and exit 2, not a banner and then uvicorn's exit 3.
    The probe is closed and uvicorn binds again (and logs where it listens); a server that
    takes the port in that instant still ends in uvicorn's own error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise click.BadParameter(
                f"cannot listen on {host} port {port}: {exc.strerror or exc}", param_hint="--port"
            ) from None


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


MIN_TOKEN = 16  # characters of a token given: a short one is guessed, throttle or not


def _check_token(token: str | None) -> str | None:
    """A token given is kept as given, if it is long enough to be worth guarding."""
    return None if token is None else _valid_token(token, "'--token'")


def _valid_token(token: str, source: str) -> str:
    if len(token.strip()) < MIN_TOKEN:
        what = "empty" if not token.strip() else f"{len(token.strip())} characters"
        raise click.BadParameter(
            f"the token is {what}: give one of at least {MIN_TOKEN} characters, or none"
            " for a random one",
            param_hint=source,
        )
    return token


def _read_token_file(path: Path) -> str:
    """The token in ``path`` (its first line), if only its owner may read it: a token in a
    file others can read is no secret, and serving with it would hide that."""
    try:
        mode = path.stat().st_mode
        token = path.read_text("utf-8").partition("\n")[0].strip()
    except OSError as exc:
        raise click.BadParameter(
            f"cannot read {path}: {exc.strerror or exc}", param_hint="'--token-file'"
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise click.BadParameter(
            f"{path} can be read by others (mode {stat.S_IMODE(mode):o}): chmod 600 it",
            param_hint="'--token-file'",
        )
    return _valid_token(token, "'--token-file'")


@contextlib.contextmanager
def _generated_token_file(token: str) -> Iterator[Path]:
    """A new file only this user can read (0600, created so), holding ``token``, removed
    when the server stops: the token stays out of the terminal's scrollback and the
    journal, which keep what ``serve`` prints."""
    folder = os.environ.get("XDG_RUNTIME_DIR") or None  # a per-user tmpfs where there is one
    handle, name = tempfile.mkstemp(prefix="poisonq-token-", dir=folder)
    # uvicorn stops on SIGTERM and then raises it again with the handler it found: by
    # default that ends the process at once, and the file would stay.
    previous = signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(token + "\n")
        yield Path(name)
    finally:
        signal.signal(signal.SIGTERM, previous)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _forwarded_ips(value: str | None) -> str | None:
    """Addresses or networks separated by commas, or ``*``: each checked here, so a typo is
    an error at start rather than a proxy whose headers are silently ignored."""
    if value is None or value.strip() == "*":
        return value if value is None else "*"
    for item in value.split(","):
        try:
            ipaddress.ip_network(item.strip(), strict=False)
        except ValueError:
            raise click.BadParameter(
                f"{item.strip()!r} is not an address or network", param_hint="--forwarded-allow-ips"
            ) from None
    return ",".join(item.strip() for item in value.split(","))


def _public_url(value: str | None) -> str | None:
    """The scheme and host (and port) operators reach the server at, kept without a trailing
    slash: a relative or mistyped one would make every alert's link a dead one. No user or
    password (the value is printed and published in a metric that alerts carry), and no path:
    the UI's own links start at ``/ui/``, so it is served at the root of its host."""
    if value is None:
        return None
    parts = urlsplit(value.strip())
    problem = None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        problem = "is not an absolute http or https URL"
    elif any(c.isspace() for c in parts.netloc):
        problem = "has a space in its host"
    elif parts.username is not None or parts.password is not None:
        problem = "carries a user or password, which the metric poisonq_ui_info would publish"
    elif parts.path.strip("/"):
        problem = (
            "has a path: the UI is served at the root of its host (/ui/), so give the proxy"
            " a host name of its own"
        )
    if problem is not None:
        raise click.BadParameter(
            f"{value!r} {problem} (like https://poisonq.example.com)", param_hint="'--public-url'"
        )
    return value.strip().rstrip("/")


def _log_config() -> dict[str, Any]:
    """uvicorn's logging, with the server's own lines (a client gone mid-body) beside its
    access lines, in its format."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["poisonq.server"] = {
        "handlers": ["default"],
        "level": "INFO",
        "propagate": False,
    }
    return config


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=8080,
    show_default=True,
    help="Port to listen on.",
)
@click.option(
    "--token",
    envvar="POISONQ_TOKEN",
    callback=lambda _ctx, _param, value: _check_token(value),
    help="Bearer token for writes (and reads), at least 16 characters (also from"
    " POISONQ_TOKEN; visible to others in the process list: prefer --token-file).",
)
@click.option(
    "--token-file",
    type=PathParam(dir_okay=False, path_type=Path),
    help="Read the token from this file's first line; only its owner may read the file.",
)
@click.option("--open-reads", is_flag=True, help="Let anyone read (the UI, GET /api, /metrics).")
@click.option(
    "--forwarded-allow-ips",
    callback=lambda _ctx, _param, value: _forwarded_ips(value),
    help="Believe X-Forwarded-For and X-Forwarded-Proto from these addresses only (a reverse"
    " proxy's; comma-separated addresses or networks, or *). Default: from none.",
)
@click.option(
    "--secure-cookies",
    is_flag=True,
    help="Mark the session cookie Secure (behind TLS). It is anyway on a request that came"
    " over HTTPS, as a proxy of --forwarded-allow-ips says with X-Forwarded-Proto.",
)
@click.option(
    "--public-url",
    callback=lambda _ctx, _param, value: _public_url(value),
    help="The address operators open the server at (behind a proxy, the proxy's, e.g."
    " https://poisonq.example.com): /metrics says it, so alerts link the UI absolutely.",
)
@click.option(
    "--max-send-bytes",
    type=click.IntRange(1024),
    default=SEND_BYTES,
    show_default=True,
    help="The largest body of an API send (POST /api/queues/QUEUE/messages) with the token;"
    f" every other request's body is at most {FORM_BYTES // 1024} KiB.",
)
@click.option(
    "--read-timeout",
    type=click.FloatRange(min=1),
    default=READ_TIMEOUT,
    show_default=True,
    help="Seconds a request's headers, and then its body, may take to arrive.",
)
@click.option(
    "--housekeep-every",
    type=click.FloatRange(min=0),
    default=HOUSEKEEP_EVERY,
    show_default=True,
    metavar="SECONDS",
    help="Apply what is due on the store's clock to every entity this often, in a thread"
    " (as poisonq housekeep --every does); 0: never (reads still apply what they read).",
)
@click.pass_obj
def serve(
    app: App,
    /,
    host: str,
    port: int,
    token: str | None,
    token_file: Path | None,
    open_reads: bool,
    forwarded_allow_ips: str | None,
    secure_cookies: bool,
    public_url: str | None,
    max_send_bytes: int,
    read_timeout: float,
    housekeep_every: float,
) -> None:
    """Serve the HTTP API, the dead-letter explorer and metrics.

    Listens on 127.0.0.1 unless --host says otherwise. Writes (send, resubmit, purge,
    cancel) need the token; reads too unless --open-reads. Without --token or --token-file
    a random token is made and written to a new file only you can read: its path is
    printed, and it is removed when the server stops. The API's OpenAPI document is at
    /api/openapi.json, the web UI at /ui/, Prometheus metrics at /metrics. Every
    --housekeep-every seconds, what is due on the store's clock is applied everywhere.
    """
    try:
        import uvicorn

        from poisonq.server import create_app
        from poisonq.server.auth import new_token
        from poisonq.server.guard import RequestLimits, server_config
    except ImportError as exc:
        raise click.ClickException(
            f"poisonq serve needs the server extra: pip install 'poisonq[server]' ({exc})"
        ) from None
    if token is not None and token_file is not None:
        raise click.UsageError("give --token (or POISONQ_TOKEN) or --token-file, not both")
    _check_port(host, port)
    if token_file is not None:
        token = _read_token_file(token_file)
    limits = RequestLimits(send_bytes=max_send_bytes, read_timeout=read_timeout)
    with contextlib.ExitStack() as stack:
        if token is None:
            token = new_token()
            written = stack.enter_context(_generated_token_file(token))
            what = "writes" if open_reads else "writes and reads"
            app.err.print(f"token (for {what}) in {written}", soft_wrap=True)
        server = create_app(
            app.broker,
            token=token,
            open_reads=open_reads,
            limits=limits,
            secure_cookies=secure_cookies,
            public_url=public_url,
        )
        shown = f"[{host}]" if ":" in host else host
        app.err.print(f"poisonq serving at http://{shown}:{port}/ui/", soft_wrap=True)
        if public_url is not None:
            app.err.print(f"alerts link {public_url}/ui/", soft_wrap=True)
        if not _is_loopback(host):
            app.err.print(f"warning: listening on {host}, not only this machine", style="yellow")
        entities = {parse_address(info.name).entity for info in app.broker.entities()}
        for name in sorted(e for e in entities if dot_segments(e)):
            app.err.print(
                f"warning: {name!r} has a '.' or '..' segment, which clients that normalise"
                " paths do not send as it is: move its messages to a queue with another name",
                style="yellow",
                soft_wrap=True,
            )
        config = server_config(
            server,
            forwarded_allow_ips,
            host=host,
            port=port,
            log_level="info",
            log_config=_log_config(),
        )
        stop = threading.Event()
        stack.callback(stop.set)
        if housekeep_every:
            loop = (app.broker, housekeep_every, stop, lambda _names: None)
            threading.Thread(target=keep_time, args=loop, name="housekeeping", daemon=True).start()
        uvicorn.Server(config).run()
