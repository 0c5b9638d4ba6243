"""The crash guard: a transform's exception or crash becomes one row's result."""

from __future__ import annotations

import os
import signal
import sys
import types
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pyspark import cloudpickle as spark_cloudpickle

from poisonq import PermanentError
from poisonq.worker.guard import WINDOW, Crashed, Failed, run_inline, run_isolated


def transform(row: dict[str, Any]) -> dict[str, Any] | None:
    n = row["n"]
    if n in row["crash"]:
        os._exit(3)
    if n in row["permanent"]:
        raise PermanentError(f"row {n} is invalid")
    if n in row["transient"]:
        raise TimeoutError(f"row {n} timed out")
    return None if n % 7 == 6 else {"n": n * 2}


def rows(count: int, **kinds: set[int]) -> list[dict[str, Any]]:
    sets = {kind: kinds.get(kind, set()) for kind in ("crash", "permanent", "transient")}
    return [{"n": n, **sets} for n in range(count)]


def kinds(results: list[Any]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {"ok": [], "failed": [], "permanent": [], "crashed": []}
    for n, result in enumerate(results):
        match result:
            case Failed(permanent=True):
                found["permanent"].append(n)
            case Failed():
                found["failed"].append(n)
            case Crashed():
                found["crashed"].append(n)
            case _:  # what the transform returned
                found["ok"].append(n)
    return found


@pytest.mark.parametrize(
    "crash",
    [
        set(),
        {0},
        {5},
        {WINDOW - 1, WINDOW},
        {3, 4, 5},
        {1, WINDOW + 10, 2 * WINDOW + 3, 3 * WINDOW - 1},
    ],
)
def test_crashing_rows_are_isolated_and_the_rest_processed(crash: set[int]) -> None:
    count = 3 * WINDOW
    results = run_isolated(transform, rows(count, crash=crash, permanent={2}, transient={9}), ())
    assert len(results) == count
    found = kinds(results)
    assert found["crashed"] == sorted(crash)
    assert found["failed"] == [9]
    assert set(found["ok"]) == set(range(count)) - crash - {2, 9}
    for n in found["ok"]:
        assert results[n] == (None if n % 7 == 6 else {"n": n * 2})


def test_frequent_crashes_shrink_the_window_and_every_row_still_gets_its_result() -> None:
    count = 4 * WINDOW
    crash = set(range(5, count, 37))  # about one row in 37: windows of a dozen rows or so
    results = run_isolated(transform, rows(count, crash=crash), ())
    found = kinds(results)
    assert found["crashed"] == sorted(crash)
    assert set(found["ok"]) == set(range(count)) - crash


def test_a_crash_record_says_how_the_worker_died() -> None:
    [result] = run_isolated(transform, rows(1, crash={0}), ())
    assert isinstance(result, Crashed)
    assert result.failure.error_type == "WorkerCrashed"
    assert "exit code 3" in result.failure.message


def test_exceptions_carry_their_type_traceback_and_permanence() -> None:
    results = run_isolated(transform, rows(3, permanent={0}, transient={1}), (ValueError,))
    permanent, transient, ok = results
    assert isinstance(permanent, Failed) and permanent.permanent
    assert permanent.failure.error_type == "poisonq.errors.PermanentError"
    assert "row 0 is invalid" in permanent.failure.message
    assert "Traceback" in permanent.failure.traceback
    assert isinstance(transient, Failed) and not transient.permanent
    assert transient.failure.error_type == "TimeoutError"
    assert ok == {"n": 4}


def test_user_types_can_be_marked_permanent() -> None:
    def invalid(row: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("bad")

    [result] = run_inline(invalid, [{}], (ValueError,))
    assert isinstance(result, Failed) and result.permanent


def loud(row: dict[str, Any]) -> dict[str, Any]:
    print("transforming", row["n"])  # stdout is the helper's frames channel: must not leak in
    return {"n": row["n"]}


def test_a_transform_that_prints_does_not_corrupt_the_results() -> None:
    results = run_isolated(loud, [{"n": n} for n in range(50)], ())
    assert results == [{"n": n} for n in range(50)]


def test_a_transform_only_pyspark_can_ship_still_runs_in_the_helper() -> None:
    # A module the helper cannot import, which Spark was told to ship by value: the light
    # pickle refers to it by name, so the helper falls back to pyspark's pickle.
    module = types.ModuleType("poisonq_test_unimportable")
    exec("def double(row):\n    return {'n': row['n'] * 2}\n", module.__dict__)
    sys.modules[module.__name__] = module
    spark_cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    try:
        results = run_isolated(module.double, rows(3), ())
    finally:
        spark_cloudpickle.unregister_pickle_by_value(module)  # type: ignore[no-untyped-call]
        del sys.modules[module.__name__]
    assert results == [{"n": 0}, {"n": 2}, {"n": 4}]


def counted(row: dict[str, Any]) -> dict[str, Any] | None:
    """``transform``, after appending the row's number to the file the row names: a record
    of every run of every row, which outlives the child that ran it."""
    with open(row["runs"], "a") as runs:
        runs.write(f"{row['n']}\n")
    return transform(row)


def test_a_crash_runs_again_only_the_rows_since_the_childs_last_record_of_results(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    crash = WINDOW + 10  # the first record (rows 0 to WINDOW - 1) is written before it
    data = [{**row, "runs": str(runs)} for row in rows(3 * WINDOW, crash={crash})]
    results = run_isolated(counted, data, ())
    assert kinds(results)["crashed"] == [crash]
    times = Counter(int(n) for n in runs.read_text().split())
    assert sorted(n for n, count in times.items() if count == 2) == list(range(WINDOW, crash))
    assert set(times.values()) <= {1, 2}
    assert set(times) == set(range(3 * WINDOW))


def test_with_a_window_of_one_a_crash_runs_no_finished_row_again(tmp_path: Path) -> None:
    """A caller whose rows are costly (map_batches' chunks of messages) gives a window of
    one: each row's result is recorded as it is done, so a crash loses only its own row."""
    runs = tmp_path / "runs"
    data = [{**row, "runs": str(runs)} for row in rows(40, crash={17, 30})]
    results = run_isolated(counted, data, (), window=1)
    assert kinds(results)["crashed"] == [17, 30]
    assert Counter(int(n) for n in runs.read_text().split()) == Counter(range(40))


def crashes_when_run_again(row: dict[str, Any]) -> dict[str, Any] | None:
    """``counted``, but a row in ``again`` crashes the second time it runs (a crash that
    depends on more than the row: the state of a service, the time)."""
    n = row["n"]
    with open(row["runs"], "a+") as runs:
        runs.write(f"{n}\n")
        runs.seek(0)
        if n in row["again"] and runs.read().split().count(str(n)) == 2:
            os._exit(4)
    return transform(row)


def test_a_row_run_again_after_a_crash_that_crashes_then_is_crashed_and_the_rest_go_on(
    tmp_path: Path,
) -> None:
    """After a crash the next child runs the rows since the last record and those after the
    crashed row in one span that leaves that row out; when a row it runs again crashes this
    time, that row is crashed too, neither crashed row runs again, and every other row
    gets its result."""
    runs = tmp_path / "runs"
    data = [{**row, "runs": str(runs), "again": {4}} for row in rows(40, crash={10})]
    results = run_isolated(crashes_when_run_again, data, ())
    found = kinds(results)
    assert found["crashed"] == [4, 10]
    assert set(found["ok"]) == set(range(40)) - {4, 10}
    times = Counter(int(n) for n in runs.read_text().split())
    assert (times[4], times[10]) == (2, 1)
    assert set(times) == set(range(40))


def echo(row: bytes) -> dict[str, Any]:
    return {"body": row[::-1], "size": len(row)}


def test_rows_and_results_larger_than_the_shared_memory_at_start_go_through() -> None:
    bodies = [os.urandom(64 * 1024) for _ in range(100)]  # 6.4 MB each way
    assert run_isolated(echo, bodies, ()) == [echo(body) for body in bodies]


def helper_pids() -> set[int]:
    """The crash guard's helper processes started by this process."""
    children = Path(f"/proc/self/task/{os.getpid()}/children").read_text().split()
    return {
        int(pid) for pid in children if b"helper_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    }


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_a_lost_helper_is_started_again_at_the_next_call() -> None:
    def triple(row: dict[str, Any]) -> dict[str, Any]:
        return {"n": row["n"] * 3}

    before = helper_pids()
    assert run_isolated(triple, rows(3), ()) == [{"n": 0}, {"n": 3}, {"n": 6}]
    [helper] = helper_pids() - before
    os.kill(helper, signal.SIGKILL)
    os.waitpid(helper, 0)
    assert run_isolated(triple, rows(3), ()) == [{"n": 0}, {"n": 3}, {"n": 6}]
    assert len(helper_pids() - before) == 1


def test_a_failure_under_the_guard_has_its_source_lines_and_its_fingerprint_outside_it() -> None:
    """This module is pickled by value for the helper (it is not poisonq's), and its code
    keeps its file: the traceback shows the line that raised, and the fingerprint (which
    names the file) is the one the same failure has without the guard."""
    [guarded] = run_isolated(transform, rows(1, transient={0}), ())
    [inline] = run_inline(transform, rows(1, transient={0}), ())
    assert isinstance(guarded, Failed) and isinstance(inline, Failed)
    assert f'File "{__file__}"' in guarded.failure.traceback
    assert 'raise TimeoutError(f"row {n} timed out")' in guarded.failure.traceback
    assert guarded.failure.fingerprint == inline.failure.fingerprint


def _lookup(prices: dict[str, dict[str, float]], sku: str) -> float:
    return prices["catalog"][sku] * 1.2  # the KeyError's carets point into this line


def _price(order: dict[str, Any]) -> float:
    try:
        return _lookup({"catalog": {}}, order["sku"])
    except KeyError as exc:
        raise RuntimeError(f"order {order['n']} has no price") from exc


def _total(order: dict[str, Any]) -> float:
    try:
        return _price(order)
    except RuntimeError as exc:
        exc.add_note(f"while totalling order {order['n']}")
        try:
            raise ValueError("no total")
        except ValueError as other:  # handling another: a context, not a cause
            if order["n"] == 1:
                raise LookupError("no total") from None
            raise LookupError("no total") from other


def failing_deep(row: dict[str, Any]) -> dict[str, Any]:
    """Raises as user code does: a few calls down, chained, with a note; row 1 suppresses
    the context; row 2 raises an exception group, row 3 a ``SyntaxError``."""
    if row["n"] == 2:
        raise ExceptionGroup("both", [KeyError("a"), TimeoutError("b")])
    if row["n"] == 3:
        compile("x = (", "<order 3>", "exec")
    return {"total": _total({"n": row["n"], "sku": f"sku-{row['n']}"})}


def test_a_failure_under_the_guard_is_recorded_exactly_as_outside_it() -> None:
    """The child takes a failure down as data and the caller formats it: the traceback
    text (every frame, line and caret, each exception of a ``raise ... from`` chain and its
    context, the notes), the message, the type and the fingerprint are those of the same
    failure outside the guard, deep in user code, with or without a suppressed context;
    exceptions the caller does not remake (a group, a SyntaxError) as well."""
    data = [{"n": n} for n in range(4)]
    guarded = run_isolated(failing_deep, data, ())
    inline = run_inline(failing_deep, data, ())
    for under, outside in zip(guarded, inline, strict=True):
        assert isinstance(under, Failed) and isinstance(outside, Failed)
        assert under.failure.traceback == outside.failure.traceback
        assert under.failure.fingerprint == outside.failure.fingerprint
        assert (under.failure.error_type, under.failure.message) == (
            outside.failure.error_type,
            outside.failure.message,
        )
    chained = guarded[0].failure
    assert chained.error_type == "KeyError"
    assert "The above exception was the direct cause" in chained.traceback
    assert "During handling of the above exception" in chained.traceback
    assert "while totalling order 0" in chained.traceback
    assert "^^^^" in chained.traceback
    assert "During handling" not in guarded[1].failure.traceback
    assert guarded[1].failure.error_type == "LookupError"


def stamped(row: dict[str, Any]) -> dict[str, Any]:
    return {"n": row["n"], "by": "the stamp of the test"}  # a constant Python does not intern


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_a_transform_keeps_its_helper_while_the_caller_holds_its_constants() -> None:
    """The same transform pickles to the same bytes however many references its constants
    have (the caller holds rows it returned), so it keeps its one helper."""
    before = helper_pids()
    assert run_isolated(stamped, rows(2), ()) == [stamped(row) for row in rows(2)]
    held = run_inline(stamped, rows(2), ())
    assert run_isolated(stamped, rows(2), ()) == held
    assert len(helper_pids() - before) == 1


def loaded_modules(row: Any) -> dict[str, Any]:
    return {"modules": set(sys.modules)}


def test_the_helper_loads_a_transform_by_value_without_cloudpickle_or_a_fork_handler() -> None:
    """A transform pickled by value (this module's) is rebuilt in the helper without
    cloudpickle, and the helper loads no module that registers a fork handler (threading,
    logging, random): such a handler runs Python code in every child forked, so each crash
    would pay for it."""
    (result,) = run_isolated(loaded_modules, [0], ())
    loaded = result["modules"]
    assert "poisonq.worker.child" in loaded
    assert not loaded & {"cloudpickle", "threading", "logging", "random", "poisonq.model"}


def counting_down(step: int) -> Any:
    """A closure over ``step`` and over itself (a cell that must be filled after the
    function exists), with a default and a keyword-only default."""

    def down(row: int, floor: int = 0, *, scale: int = 1) -> int:
        return floor if row <= floor else scale * (1 + down(row - step, floor, scale=1))

    return down


def closing(row: dict[str, Any]) -> dict[str, Any]:
    return {"n": counting_down(2)(row["n"], scale=3), "base": os.path.basename("/a/b.txt")}


def test_a_transform_rebuilt_in_the_helper_keeps_its_closures_defaults_and_globals() -> None:
    results = run_isolated(closing, [{"n": n} for n in range(6)], ())
    assert results == [closing({"n": n}) for n in range(6)]
    inner = counting_down(3)
    assert run_isolated(lambda row: {"n": inner(row)}, [7, 9], ()) == [{"n": 3}, {"n": 3}]


class WarmedOnce:
    """A transform whose ``warm_up`` records the process it ran in, and which returns that
    record with its own process: what the guard's children inherit from their helper."""

    warmed_in: ClassVar[list[int]] = []

    def warm_up(self) -> None:
        self.warmed_in.append(os.getpid())

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        if row["n"] in row["crash"]:
            os._exit(3)
        return {"warmed_in": list(self.warmed_in), "ran_in": os.getpid()}


def test_a_transforms_warm_up_runs_once_in_the_helper_and_every_child_inherits_it() -> None:
    """Whatever a transform's ``warm_up`` loads (Arrow's compute functions, for the batch
    functions' wrapper) is loaded once in the helper before it forks, not by each child
    after a crash."""
    results = run_isolated(WarmedOnce(), rows(6, crash={2}), ())
    assert isinstance(results[2], Crashed)  # so the rows after it ran in another child
    ran = results[:2] + results[3:]
    assert all(len(result["warmed_in"]) == 1 for result in ran)
    assert {result["warmed_in"][0] for result in ran}.isdisjoint(r["ran_in"] for r in ran)
