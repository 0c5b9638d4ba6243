"""PySpark's Python worker daemon, quiet about workers whose task was cancelled.

When a Spark job fails, Spark cancels its other running tasks and closes their sockets; the
Python worker of such a task then meets a broken pipe, and PySpark's daemon prints the
worker's traceback on the console: a ``BrokenPipeError`` stack for every isolation job that
fails, which says nothing about the data. The sessions poisonq starts
(:func:`poisonq.spark.local_session`) run this daemon instead (``spark.python.daemon.module``):
the same daemon, with a worker that ends quietly when the JVM has hung up on it.

It lives outside :mod:`poisonq.spark` on purpose: the daemon forks every worker, and must not
import pyarrow, whose threads a fork does not carry, before it does.
"""

from __future__ import annotations

import socket

from pyspark import daemon

_worker = daemon.worker


def worker(sock: socket.socket, authenticated: bool) -> int:
    """PySpark's worker; a socket the JVM closed ends it with code 1 (not reused), quietly."""
    try:
        return _worker(sock, authenticated)
    except (BrokenPipeError, ConnectionResetError):
        return 1


daemon.worker = worker

if __name__ == "__main__":
    daemon.manager()
