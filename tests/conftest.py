"""Shared fixtures: a clock tests can move, and the stores every engine test runs against.

The ``url`` fixture is parametrized over both stores, so every test that uses it (directly or
through ``broker`` and ``queue``) is one conformance suite: ``[sqlite]`` runs on a real SQLite
file in a temporary directory, ``[postgresql]`` on a real PostgreSQL server that the session
starts from the machine's binaries (``poisonq.testing.pgserver``) and stops at the end. Each
PostgreSQL test gets a schema of its own (named in the URL's ``search_path``), created empty
and migrated by the store as it opens, so tests never see each other's queues.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

import poisonq
from poisonq import Broker, ManualClock
from tests import aio_driver
from tests.helpers import STORES, Orders, store_url

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from poisonq.testing.pgserver import TemporaryServer

_schemas = itertools.count(1)
# The fixtures that start a PostgreSQL server, and the Spark ones: what `make check` leaves out.
# (`item.fixturenames` holds every fixture a test needs, also through other fixtures.)
_POSTGRES_FIXTURES = {"pg_server", "pg_url", "own_server"}
_SPARK_FIXTURES = {"spark", "cluster"}

# `make check` (``--hypothesis-profile=check``) tries a quarter of the examples `make test`
# tries (hypothesis' default, 100): the same properties, a faster first look.
settings.register_profile("check", max_examples=25)


def pytest_report_header() -> str:
    """The PySpark under test: ``make test`` runs the Spark tests on two releases."""
    try:
        return f"pyspark: {version('pyspark')}"
    except PackageNotFoundError:
        return "pyspark: not installed"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test by what it needs, so the fast tier (``make check``: ``-m "not spark and
    not postgres and not browser and not slow"``) can leave out the tests that start a
    PostgreSQL server, a SparkSession or Chromium. A test needs PostgreSQL when it asks for
    one of its fixtures or runs on the ``postgresql`` store of the ``url`` parameter.

    ``pyspark`` marks what the run on the oldest supported PySpark (``make
    test-oldest-spark``) repeats: the ``spark`` tests, and those of a module that uses
    PySpark's API without a session."""
    for item in items:
        needs = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        params = callspec.params.values() if callspec is not None else ()
        if needs & _POSTGRES_FIXTURES or "postgresql" in params:
            item.add_marker(pytest.mark.postgres)
        if needs & _SPARK_FIXTURES or item.module.__name__.startswith("tests.test_spark"):
            item.add_marker(pytest.mark.spark)
            item.add_marker(pytest.mark.pyspark)
        elif _uses_pyspark(item.module):
            item.add_marker(pytest.mark.pyspark)


def _uses_pyspark(module: ModuleType) -> bool:
    """Whether a test module imported something of PySpark's (a module, class or function)."""
    for value in vars(module).values():
        name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", "")
        if isinstance(name, str) and name.partition(".")[0] == "pyspark":
            return True
    return False


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[TemporaryServer]:
    """One PostgreSQL server for the session, in a temporary directory, removed at the end
    (also when tests fail). No fsync: the suite tests semantics, not power cuts."""
    from poisonq.testing.pgserver import TemporaryServer

    with TemporaryServer({"fsync": "off", "full_page_writes": "off"}) as server:
        server.create_database("poisonq")
        yield server


@pytest.fixture
def own_server() -> Iterator[TemporaryServer]:
    """A server of this test's own, since it is restarted under the test."""
    from poisonq.testing.pgserver import TemporaryServer

    with TemporaryServer({"fsync": "off"}) as server:
        server.create_database("outage")
        yield server


@pytest.fixture
def pg_url(pg_server: TemporaryServer) -> str:
    """A fresh, empty schema on the session's server."""
    schema = f"test_{next(_schemas)}"
    pg_server.execute(f"CREATE SCHEMA {schema}", database="poisonq")
    return pg_server.database_url("poisonq") + f"?options=-csearch_path%3D{schema}"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'queues.db'}"


@pytest.fixture
def live(url: str) -> Iterator[Broker]:
    """A broker on the real clock, which Spark's Python workers share."""
    with poisonq.connect(url) as opened:
        yield opened


@pytest.fixture(params=STORES)
def url(request: pytest.FixtureRequest) -> str:
    """The store under test: each test using it runs once per store."""
    return store_url(request)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The conformance modules (``BOTH_APIS = True``) run each test that uses ``broker``
    through both APIs: ``[sync]`` and ``[aio]`` (the asyncio API, driven by
    ``tests/aio_driver.py``), but those their ``SYNC_ONLY`` names, each with the reason.
    The ``[aio]`` runs are marked ``asyncio_variant``: `make test` runs them, the fast tier
    the sync ones (``tests/test_aio.py``'s own tests it runs)."""
    module = metafunc.module
    if not getattr(module, "BOTH_APIS", False) or "broker" not in metafunc.fixturenames:
        return
    if metafunc.function.__name__ not in getattr(module, "SYNC_ONLY", {}):
        variant = pytest.param("aio", marks=pytest.mark.asyncio_variant)
        metafunc.parametrize("api", ["sync", variant])


@pytest.fixture
def api() -> str:
    """Which API the ``broker`` fixture gives: the sync one, unless a conformance module
    parametrizes it."""
    return "sync"


@pytest.fixture
def broker(url: str, clock: ManualClock, api: str) -> Iterator[Broker]:
    if api == "aio":
        with aio_driver.connect(url, clock) as driven:
            yield driven
        return
    with poisonq.connect(url, clock=clock) as opened:
        yield opened


@pytest.fixture
def queue(broker: Broker) -> str:
    """A queue named ``orders`` with 3 deliveries and a 30 s lock."""
    broker.create_queue("orders", max_delivery_count=3, lock_duration=30)
    return "orders"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local SparkSession for the whole run (starting one costs seconds)."""
    from poisonq.spark.session import local_session

    session = local_session("poisonq-tests")
    yield session
    session.stop()


@pytest.fixture
def orders(pg_url: str, request: pytest.FixtureRequest) -> Iterator[Orders]:
    """1,000 orders, about 1 % of them bad, for the Spark jobs of ``tests/spark_jobs.py``;
    parametrized indirectly with a number, that many kill their Python worker."""
    from tests.chaos.scenarios import send_orders

    with poisonq.connect(pg_url) as broker:
        broker.create_queue("orders", max_delivery_count=3)
        good, bad = send_orders(broker, "orders", 1000, crash=getattr(request, "param", 0))
        yield Orders(pg_url, broker, good, bad)
