"""``python -m tests.chaos``: run every kill scenario many times, each with its own seed, and
print a table of what the runs came to (``make chaos``). Exits 1 if any run lost, duplicated
or misplaced a message, left one held, or unbalanced the audit."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from random import Random

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from poisonq.testing.pgserver import TemporaryServer
from tests.chaos.scenarios import SCENARIOS, Scenario, Store
from tests.chaos.verdict import Verdict


@dataclasses.dataclass
class Tally:
    scenario: str
    store: str
    runs: int = 0
    faults: int = 0
    lost: int = 0
    duplicated: int = 0
    misplaced: int = 0
    held: int = 0
    unbalanced: int = 0
    errors: int = 0
    seconds: float = 0.0

    def add(self, verdict: Verdict) -> None:
        self.faults += verdict.faults
        self.lost += len(verdict.lost)
        self.duplicated += len(verdict.duplicated)
        self.misplaced += len(verdict.misplaced) + len(verdict.double_holders)
        self.held += verdict.held
        self.unbalanced += not verdict.balanced

    @property
    def ok(self) -> bool:
        return (
            not (self.lost or self.duplicated or self.misplaced or self.held or self.unbalanced)
            and not self.errors
        )


def _store(
    scenario: Scenario, store: str, seed: int, work: Path, server: TemporaryServer | None
) -> Store:
    """A new database for every run: a SQLite file in its directory, or a PostgreSQL database."""
    if store == "sqlite":
        return Store(f"sqlite:///{work / 'store.db'}")
    assert server is not None
    return Store(server.create_database(f"chaos_{scenario.name}_{seed}"), server)


def _run(
    scenario: Scenario,
    store: str,
    seed: int,
    root: Path,
    server: TemporaryServer | None,
    console: Console,
    tally: Tally,
) -> None:
    """Run one scenario on one store with one seed into ``tally``; a run that fails or breaks
    a guarantee is printed as it happens."""
    where = f"{scenario.name} on {store}, seed {seed}"
    work = root / f"{scenario.name}-{store}-{seed}"
    work.mkdir()
    started = time.monotonic()
    try:
        verdict = scenario.run(_store(scenario, store, seed, work, server), work, Random(seed))
    except Exception:
        with _TALLIES:
            tally.errors += 1
        console.print(f"[red]{where}:[/red] {traceback.format_exc()}")
    else:
        with _TALLIES:
            tally.add(verdict)
        if not verdict.ok:
            console.print(f"[red]{where}:[/red] {verdict.problems()}")
    with _TALLIES:
        tally.runs += 1
        tally.seconds += time.monotonic() - started


_TALLIES = threading.Lock()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=50, help="runs per scenario and store")
    parser.add_argument("--seed", type=int, default=1, help="the first run's seed")
    parser.add_argument(
        "--scenario", action="append", choices=[s.name for s in SCENARIOS], help="(repeatable)"
    )
    parser.add_argument(
        "--store",
        action="append",
        choices=["sqlite", "postgresql"],
        help="only on this store (repeatable; default: each scenario's stores)",
    )
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark scenarios")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at once (each in its own processes, store and directory; the outage"
        " scenario, which restarts the shared PostgreSQL server, always runs alone)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the retries through an outage are expected
    wanted = set(args.store or ("sqlite", "postgresql"))
    chosen = [
        dataclasses.replace(s, stores=tuple(st for st in s.stores if st in wanted))
        for s in SCENARIOS
        if (not args.scenario or s.name in args.scenario) and not (args.no_spark and s.spark)
    ]
    chosen = [s for s in chosen if s.stores]
    console = Console()
    if not console.is_terminal:
        console = Console(width=140)
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chaos-")))
        server: TemporaryServer | None = None
        if any("postgresql" in s.stores for s in chosen):
            server = stack.enter_context(TemporaryServer())
        progress = stack.enter_context(Progress(console=console))
        task = progress.add_task("chaos", total=sum(len(s.stores) for s in chosen) * args.runs)

        seeds = range(args.seed, args.seed + args.runs)
        tallies = {(s.name, store): Tally(s.name, store) for s in chosen for store in s.stores}
        runs = [(s, store, seed) for s in chosen for store in s.stores for seed in seeds]

        def run(scenario: Scenario, store: str, seed: int) -> None:
            tally = tallies[scenario.name, store]
            _run(scenario, store, seed, root, server, console, tally)
            progress.update(task, description=f"{scenario.name} on {store}", advance=1)

        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for done in [pool.submit(run, *each) for each in runs if not each[0].alone]:
                done.result()
        for each in runs:
            if each[0].alone:
                run(*each)
    table = Table(title="poisonq chaos")
    for column in (
        "scenario", "store", "runs", "faults injected", "lost", "duplicated",
        "misplaced", "held", "audit", "errors", "s/run",
    ):  # fmt: skip
        table.add_column(column, justify="left" if column in ("scenario", "store") else "right")
    for t in tallies.values():
        audit = "balanced" if not t.unbalanced else f"{t.unbalanced} unbalanced"
        table.add_row(
            t.scenario, t.store, str(t.runs), str(t.faults), str(t.lost), str(t.duplicated),
            str(t.misplaced), str(t.held), audit, str(t.errors),
            f"{t.seconds / max(t.runs, 1):.1f}",
        )  # fmt: skip
    console.print(table)
    for t in tallies.values():
        print(
            f"chaos scenario={t.scenario} store={t.store} runs={t.runs} faults={t.faults}"
            f" lost={t.lost} duplicated={t.duplicated} misplaced={t.misplaced} held={t.held}"
            f" unbalanced={t.unbalanced} errors={t.errors}"
        )
    raise SystemExit(0 if all(t.ok for t in tallies.values()) else 1)


if __name__ == "__main__":
    main()
