"""How the Spark runtime opens a store: never by making one."""

from __future__ import annotations

from typing import Any

import poisonq


def open_existing(url: str, **options: Any) -> poisonq.Broker:
    """The store ``url`` names, which must exist (:class:`~poisonq.errors.StoreNotFoundError`
    otherwise): a pipeline, a data source or a stream reads or settles the queues of a store
    made before it, so a mistyped SQLite path is a mistake to name, not a new empty store (and
    directory) to make, on the driver or on an executor that does not see the driver's file."""
    return poisonq.connect(url, create=False, **options)
