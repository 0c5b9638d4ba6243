"""poisonq's Spark features work on PySpark 4.2 and later 4.x releases; the package says so
in its requirements, refuses others by name, and ``make test`` runs the Spark tests on the
oldest (``make test-oldest-spark``)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pyspark
import pytest

from poisonq.errors import PoisonqError, UnsupportedPySparkError
from poisonq.spark.versions import OLDEST, SUPPORTED, check

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("version", ["4.2.0", "4.2.1+build", "4.3.0", "4.3.0.dev1", "4.9.0"])
def test_pyspark_4_2_and_later_4_x_releases_are_supported(version: str) -> None:
    check(version)


@pytest.mark.parametrize("version", ["4.1.4", "4.0.0", "3.5.6", "5.0.0", "master"])
def test_an_older_or_a_next_major_pyspark_is_refused_naming_the_range_it_needs(
    version: str,
) -> None:
    with pytest.raises(UnsupportedPySparkError) as refused:
        check(version)
    assert (refused.value.version, refused.value.supported) == (version, ">=4.2,<5")
    assert f"need PySpark >=4.2,<5; this is PySpark {version}" in str(refused.value)
    # An ImportError, so that PySpark's lookup of pyspark_* data sources passes over it.
    assert isinstance(refused.value, ImportError)
    assert isinstance(refused.value, PoisonqError)


def test_the_installed_pyspark_is_supported() -> None:
    check(pyspark.__version__)


def test_the_spark_and_connect_extras_require_the_supported_range() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert f"pyspark{SUPPORTED}" in extras["spark"]
    assert f"pyspark[connect]{SUPPORTED}" in extras["connect"]


def test_the_oldest_spark_run_installs_the_oldest_supported_release() -> None:
    found = re.search(r"^OLDEST_SPARK := (\d+)\.(\d+)\.0$", (ROOT / "Makefile").read_text(), re.M)
    assert found is not None, "the Makefile names the oldest release as OLDEST_SPARK := X.Y.0"
    assert (int(found[1]), int(found[2])) == OLDEST
