"""Peak memory of this process and of the tree of processes under it, from ``/proc``.

The Python driver's own peak is the kernel's high-water mark (``VmHWM``); the JVM's too (it
is a child of the driver); the tree's peak (driver, JVM, Python workers, the crash guard's
helpers and children) is sampled by a thread, since no counter sums it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType

PAGE = os.sysconf("SC_PAGE_SIZE")
INTERVAL = 0.2  # seconds between samples of the tree


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def _descendants(root: int) -> list[int]:
    tree, found, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += tree.get(pid, [])
    return found


def _rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except OSError:
        return 0


def _high_water(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class PeakMemory:
    """``with PeakMemory() as peak: ...``, then ``peak.line()``."""

    def __init__(self) -> None:
        self.tree_peak = 0
        self.jvm_peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        me = os.getpid()
        while not self._done.wait(INTERVAL):
            pids = _descendants(me)
            self.tree_peak = max(self.tree_peak, sum(map(_rss, pids)))
            java = [p for p in pids if _is_java(p)]
            self.jvm_peak = max([self.jvm_peak, *map(_high_water, java)])

    def line(self) -> str:
        mb = 1 << 20
        return (
            f"driver_python_peak_rss_mb={_high_water(os.getpid()) / mb:.0f}"
            f" driver_jvm_peak_rss_mb={self.jvm_peak / mb:.0f}"
            f" process_tree_peak_rss_mb={self.tree_peak / mb:.0f}"
        )


def _is_java(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "java"
    except OSError:
        return False
