"""The rules of isolating a failed Spark batch, with the jobs stood in for by a function of
the part run (no Spark job: ``isolate`` only sees which parts fail)."""

from __future__ import annotations

from poisonq.defects import Defect
from poisonq.spark.isolation import Probe, isolate


def failing_with(bad: set[int], runs: list[list[int]]) -> Probe:
    def fails(part: list[int]) -> BaseException | None:
        runs.append(part)
        return ValueError(f"bad row in {part}") if bad.intersection(part) else None

    return fails


def test_a_batch_of_one_message_is_that_message_failing_alone_with_no_job() -> None:
    """The batch's own job ran it alone: it is found with the batch's error, and no job runs."""
    runs: list[list[int]] = []
    error = ValueError("the batch failed")
    assert isolate([7], [7], error, failing_with({7}, runs)) == {7: error}
    assert runs == []


def test_the_messages_failing_alone_are_found_and_nothing_else() -> None:
    runs: list[list[int]] = []
    held = list(range(1, 65))
    found = isolate(held, held, ValueError("x"), failing_with({10, 50}, runs))
    assert not isinstance(found, Defect)
    assert sorted(found) == [10, 50]
    assert len(runs) < 2 * 2 * 6 + 2  # two halvings of 64 and the two defect probes


def test_every_first_delivery_failing_alone_is_a_defect() -> None:
    """A sink that cannot be written fails every part the same way: not poison."""
    runs: list[list[int]] = []
    held = list(range(1, 9))
    fails = failing_with(set(held), runs)
    assert isinstance(isolate(held, held, ValueError("bad row in [1]"), fails), Defect)


def test_more_failing_alone_than_poison_explains_is_a_defect_saying_how_many_were_found() -> None:
    """Past 16 first deliveries failing alone, isolation stops and calls the batch a defect,
    saying how many it found failing alone among the batch's first deliveries, not that
    every message failed the same way."""
    runs: list[list[int]] = []
    held = list(range(1, 1001))
    bad = set(range(5, 1001, 20))  # 1 % of the batch, neither its first nor its last
    found = isolate(held, held, ValueError("bad row"), failing_with(bad, runs))
    assert isinstance(found, Defect)
    assert (found.failed, found.total) == (17, 1000)
    assert str(found).startswith(
        "17 of 1000 messages failed a Spark job alone, more than poison explains (BatchJobFailed:"
    )
