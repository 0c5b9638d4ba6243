"""psycopg's own warnings about poisonq's connections, kept out of the log.

When a PostgreSQL server restarts, psycopg and its pool warn once per broken connection and
once per reconnection attempt of each pool worker: 11 to 14 lines per process for an 8 s
restart, none of which the operator can act on. The client already tells the outage in two
lines (:class:`poisonq.retrying.Reachability`), so warnings about connections this store
opened (or its pool's name) are dropped; warnings about anyone else's connections, and every
error, pass.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

POOL_NAME = "poisonq"
_OWN: weakref.WeakSet[Any] = weakref.WeakSet()


def own(connection: Any) -> None:
    """Count ``connection`` as the store's: psycopg's warnings about it are dropped."""
    _OWN.add(connection)


class _OwnConnectionWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.WARNING or not isinstance(record.args, tuple):
            return True
        return not any(_is_own(arg) for arg in record.args)


def _is_own(arg: object) -> bool:
    if arg == POOL_NAME:
        return True
    connection = getattr(arg, "_conn", arg)  # a pipeline's warning names the pipeline
    try:
        return connection in _OWN
    except TypeError:  # not hashable: not a connection
        return False


def quiet_own_connections() -> None:
    """Install the filter on psycopg's loggers, once per process."""
    for name in ("psycopg", "psycopg.pool"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _OwnConnectionWarnings) for f in logger.filters):
            logger.addFilter(_OwnConnectionWarnings())
