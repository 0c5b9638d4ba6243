"""A job file (``poisonq pipeline run path/to/rows.py:FUNC``) is loaded as a module named by
its stem, so that a failure names its exception classes as the user does."""

from __future__ import annotations

from pathlib import Path

import pytest

from poisonq.cli.pipeline import load_exception, load_transform
from poisonq.failures import dead_lettering, failure_from_exception

JOB = """
class BadEvent(Exception):
    pass


def transform(row):
    raise BadEvent(f"no timestamp in {row!r}")
"""


def _job(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(JOB)
    return path


def test_a_job_files_exception_is_named_by_the_files_stem(tmp_path: Path) -> None:
    path = _job(tmp_path / "jobs", "rows.py")
    transform = load_transform(f"{path}:transform")
    bad_event = load_exception(f"{path}:BadEvent")  # --permanent: the same class
    with pytest.raises(bad_event) as raised:
        transform({"n": 1})
    failure = failure_from_exception(raised.value, 0.0)
    assert failure.error_type == "rows.BadEvent"
    dead = dead_lettering(1, "token", failure)
    assert (dead.reason, dead.description) == (
        "BadEvent",
        "rows.BadEvent: no timestamp in {'n': 1}",
    )


def test_a_job_file_named_like_another_module_keeps_a_private_name(tmp_path: Path) -> None:
    """A file called json.py must not replace the json module."""
    import json

    path = _job(tmp_path, "json.py")
    bad_event = load_exception(f"{path}:BadEvent")
    assert bad_event.__module__.startswith("poisonq_transform_")
    assert json.dumps([1]) == "[1]"


def test_a_later_job_file_of_the_same_name_replaces_the_earlier_one(tmp_path: Path) -> None:
    first = load_exception(f"{_job(tmp_path / 'a', 'events.py')}:BadEvent")
    second = load_exception(f"{_job(tmp_path / 'b', 'events.py')}:BadEvent")
    assert first is not second
    assert (first.__module__, second.__module__) == ("events", "events")
