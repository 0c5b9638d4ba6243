"""The PostgreSQL store (psycopg 3): the same queues across many processes and hosts."""

from poisonq.store.postgres.async_store import AsyncPostgresStore
from poisonq.store.postgres.store import PostgresStore

__all__ = ["AsyncPostgresStore", "PostgresStore"]
