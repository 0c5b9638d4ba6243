"""``poisonq serve``: the HTTP API, the web UI and ``/metrics`` in one process."""

from __future__ import annotations

import ipaddress
import socket
import threading

import click

from poisonq.cli.app import App
from poisonq.cli.housekeeping import keep_time

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
    if token is None:
        return None
    if len(token.strip()) < MIN_TOKEN:
        what = "empty" if not token.strip() else f"{len(token.strip())} characters"
        raise click.BadParameter(
            f"the token is {what}: give one of at least {MIN_TOKEN} characters, or none"
            " for a random one",
            param_hint="'--token'",
        )
    return token


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
    help="Bearer token for writes (and reads), at least 16 characters; a random one is made"
    " and printed if not given (also from POISONQ_TOKEN).",
)
@click.option("--open-reads", is_flag=True, help="Let anyone read (the UI, GET /api, /metrics).")
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
    app: App, /, host: str, port: int, token: str | None, open_reads: bool, housekeep_every: float
) -> None:
    """Serve the HTTP API, the dead-letter explorer and metrics.

    Listens on 127.0.0.1 unless --host says otherwise. Writes (send, resubmit, purge,
    cancel) need the token; reads too unless --open-reads. The API's OpenAPI document is at
    /api/openapi.json, the web UI at /ui/, Prometheus metrics at /metrics. Every
    --housekeep-every seconds, what is due on the store's clock is applied everywhere.
    """
    try:
        import uvicorn

        from poisonq.server import create_app
        from poisonq.server.auth import new_token
    except ImportError as exc:
        raise click.ClickException(
            f"poisonq serve needs the server extra: pip install 'poisonq[server]' ({exc})"
        ) from None
    _check_port(host, port)
    given = token is not None
    token = token or new_token()
    server = create_app(app.broker, token=token, open_reads=open_reads)
    shown = f"[{host}]" if ":" in host else host
    app.err.print(f"poisonq serving at http://{shown}:{port}/ui/", soft_wrap=True)
    if not given:
        app.err.print(f"token (for writes{'' if open_reads else ' and reads'}): {token}")
    if not _is_loopback(host):
        app.err.print(f"warning: listening on {host}, not only this machine", style="yellow")
    stop = threading.Event()
    if housekeep_every:
        loop = (app.broker, housekeep_every, stop, lambda _names: None)
        threading.Thread(target=keep_time, args=loop, name="housekeeping", daemon=True).start()
    try:
        uvicorn.run(server, host=host, port=port, log_level="info")
    finally:
        stop.set()
