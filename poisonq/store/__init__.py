"""Persistence. A store runs guarded state transitions and keeps the ledger; it has no policy."""

from __future__ import annotations

from poisonq.store.base import Store


def open_store(url: str) -> Store:
    """Open the store a URL names: ``sqlite:///path`` (or a bare path), or
    ``postgresql://user@host/database`` (psycopg is imported only then)."""
    from poisonq.errors import InvalidOptionError

    if url.startswith("sqlite://") or "://" not in url:
        from poisonq.store.sqlite import SqliteStore

        return SqliteStore.from_url(url)
    scheme = url.split("://", 1)[0]
    if scheme in ("postgresql", "postgres"):
        from poisonq.store.postgres import PostgresStore

        return PostgresStore.from_url(url)
    raise InvalidOptionError(
        f"unsupported store URL scheme {scheme!r}; use sqlite:///path or postgresql://host/db"
    )


__all__ = ["Store", "open_store"]
