"""The bisection the Processor, the pipeline runner and foreach_batch share."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from poisonq.bisection import failing_alone


def test_bisection_finds_each_member_failing_alone_in_few_runs() -> None:
    bad = {3, 17, 18, 60}
    runs: list[list[int]] = []

    def run(part: Sequence[int]) -> str | None:
        runs.append(list(part))
        return next((f"bad {n}" for n in part if n in bad), None)

    failing = failing_alone(list(range(64)), run)
    assert failing == {n: f"bad {n}" for n in sorted(bad)}
    assert len(runs) < 64 // 2  # O(k log n), not a run per member
    assert all(len(part) > 0 for part in runs)


def test_bisection_splits_a_batch_known_to_fail_without_running_it_whole() -> None:
    runs: list[list[int]] = []

    def run(part: Sequence[int]) -> str | None:
        runs.append(list(part))
        return "bad" if 1 in part else None

    assert failing_alone([0, 1], run, known_to_fail=True) == {1: "bad"}
    assert runs == [[0], [1]]
    assert failing_alone([], run) == {}


def test_bisection_stops_when_told_to() -> None:
    class Enough(Exception):
        pass

    def found(position: int, error: str) -> None:
        raise Enough(position)

    with pytest.raises(Enough, match="0"):
        failing_alone([0, 1, 2, 3], lambda part: "bad", found=found)
