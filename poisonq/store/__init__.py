"""Persistence. A store runs guarded state transitions and keeps the ledger; it has no policy."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from poisonq.store.base import Store

_ACCEPTED_URLS = (
    "sqlite:///relative/path.db, sqlite:////absolute/path.db, a file path, "
    "or postgresql://user@host/database"
)
# A bare path that starts like a URL (``sqlite:/x.db``, ``postgres:/host/db``, ``sqlite//x``)
# is a mistyped URL, not a file the user meant to create. A one-letter scheme is a drive.
_URL_LIKE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:|(sqlite|postgres|postgresql)/", re.IGNORECASE)


def open_store(url: str, *, create: bool = True) -> Store:
    """Open the store a URL names: ``sqlite:///path`` (or a bare path), or
    ``postgresql://user@host/database`` (psycopg is imported only then). With ``create``
    false, a SQLite file that does not exist raises :class:`StoreNotFoundError` instead of
    being made (a PostgreSQL database is made by its administrator, never here)."""
    from poisonq.errors import InvalidOptionError

    scheme, sep, _ = url.partition("://")
    if not sep and _URL_LIKE.match(url):
        raise InvalidOptionError(f"{url!r} is not a store URL; use {_ACCEPTED_URLS}")
    if not sep or scheme == "sqlite":
        from poisonq.store.sqlite import SqliteStore

        return SqliteStore.from_url(url, create=create)
    if scheme in ("postgresql", "postgres"):
        from poisonq.store.postgres import PostgresStore

        return PostgresStore.from_url(url)
    raise InvalidOptionError(f"unsupported store URL scheme {scheme!r}; use {_ACCEPTED_URLS}")


def redacted_url(url: str) -> str:
    """The URL with its password (if any) replaced by ``***``: fit for logs and errors."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


__all__ = ["Store", "open_store", "redacted_url"]
