"""The server in a background thread of this process, on 127.0.0.1 and a port the OS picks:
for tests, scripts and notebooks that want a real HTTP server without a second process."""

from __future__ import annotations

import socket
import threading

import uvicorn
from fastapi import FastAPI

from poisonq.server.guard import server_config

START_TIMEOUT = 10.0


class BackgroundServer:
    """``with BackgroundServer(app) as server: ... server.url ...``; stops on exit. The app
    is one ``create_app`` made, served as ``poisonq serve`` serves it (its read timeout;
    proxy headers only from ``forwarded_allow_ips``)."""

    def __init__(self, app: FastAPI, forwarded_allow_ips: str | None = None) -> None:
        # The socket is bound here, so the port is known before uvicorn starts and no other
        # process can take it in between.
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        config = server_config(app, forwarded_allow_ips, log_level="warning", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        for _ in range(int(START_TIMEOUT / 0.05)):
            if self._server.started:
                return self
            self._thread.join(0.05)
        self.__exit__()
        raise RuntimeError(f"the server did not start in {START_TIMEOUT:g} s")

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(START_TIMEOUT)
        self._socket.close()
