"""The ``poisonq`` data source's options: every name is checked against the list the docs
give, the store is always named, and the queue may be given as ``.load(NAME)``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import poisonq
from poisonq.errors import InvalidOptionError
from poisonq.spark.source import OPTIONS, SourceOptions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).parents[1]


def test_an_unknown_option_is_refused_in_one_line_naming_the_accepted_ones() -> None:
    options = {"url": "sqlite:////tmp/q.db", "queue": "orders", "maxMessagesPerTrigger": "5"}
    with pytest.raises(InvalidOptionError) as raised:
        SourceOptions.parse(options)
    message = str(raised.value)
    assert "\n" not in message
    assert "maxmessagespertrigger" in message
    assert all(name in message for name in OPTIONS)


def test_option_names_are_case_insensitive_as_spark_passes_them() -> None:
    parsed = SourceOptions.parse({"URL": "sqlite:////tmp/q.db", "Queue": "orders", "LEASE": "3"})
    assert (parsed.address, parsed.lease) == ("orders", 3)


def test_a_missing_url_is_an_error_not_a_default_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match=r'needs \.option\("url", URL\)'):
        SourceOptions.parse({"queue": "orders"})


def test_the_queue_may_be_the_path_of_load() -> None:
    parsed = SourceOptions.parse({"url": "sqlite:////tmp/q.db", "path": "orders"})
    assert parsed.address == "orders"


def test_the_queue_named_twice_differently_is_refused() -> None:
    with pytest.raises(InvalidOptionError, match="named twice"):
        SourceOptions.parse({"url": "sqlite:////tmp/q.db", "queue": "orders", "path": "refunds"})


def test_every_option_is_in_the_docs_table() -> None:
    """docs/spark.md lists each option in one table, one row per option."""
    docs = (ROOT / "docs" / "spark.md").read_text()
    assert all(f"| `{name}` |" in docs for name in OPTIONS if name != "path")
    assert "| `.load(NAME)` |" in docs


def test_a_spark_read_takes_the_queue_as_its_path_and_names_a_bad_option(
    spark: SparkSession, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    with poisonq.connect(url) as broker:
        broker.create_queue("orders")
        broker.sender("orders").send([poisonq.Message(body=b"a"), poisonq.Message(body=b"b")])
        reader = spark.read.format("poisonq").option("url", url)
        rows = reader.load("orders").collect()
        assert sorted(bytes(row.body) for row in rows) == [b"a", b"b"]
        with pytest.raises(Exception, match=r"unknown option.*maxmessagespertrigger"):
            reader.option("maxMessagesPerTrigger", 5).load("orders").collect()
        assert broker.audit().ok


def test_a_spark_read_without_url_creates_no_file(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception, match=r'option\("url", URL\)'):
        spark.read.format("poisonq").load("orders").collect()
    assert not (tmp_path / "poisonq.db").exists()


def test_a_mistyped_sqlite_path_is_named_and_nothing_is_made(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A SQLite path with no store behind it (a typo) is named as such, by a read and by the
    pipeline runner, and neither makes the file or its directory: Spark never makes a store
    (a new one would have none of the queues it was asked for)."""
    from poisonq.spark import Pipeline

    typo = tmp_path / "typo" / "q.db"
    url = f"sqlite:///{typo}"
    with pytest.raises(Exception, match=f"no poisonq store at {typo}"):
        spark.read.format("poisonq").option("url", url).load("orders").collect()
    with pytest.raises(poisonq.errors.StoreNotFoundError, match="no poisonq store"):
        Pipeline(
            spark, url=url, queue="orders", map=dict, schema="n long", output=str(tmp_path / "o")
        ).run()
    assert not typo.parent.exists()
