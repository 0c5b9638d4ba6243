"""How many messages the pipeline runner leases for each batch.

Every batch is a Spark job, and a job has a fixed cost (its planning, the data source's
planner processes, the commit: 0.2 s on a quiet machine, about a second under load), so a
backlog goes fastest in few, large batches: Spark's own sources read all that is available,
bounded by a limit such as Kafka's ``maxOffsetsPerTrigger``. A larger batch costs where the
pipeline starts and where a job fails: the first output (and a bug that fails most messages,
which stops the run) shows only when the first batch's job is done, and a job that fails is
bisected over its batch (the failed job, its input read once, parts of it run again), so a
poison message costs in proportion to its batch's size. A lease takes the messages that are
ready up to its size, so a small queue gives small batches whatever the size.

Hence, unless the user fixes the size, a run's first batch takes up to :data:`FIRST`
messages, each batch after it up to :data:`MOST`, and one leased after a batch that ran
isolation jobs (its job failed, or poison it held came back) :data:`FIRST` again, until a
batch runs clean. The lease taken ahead while a batch runs keeps the size it was taken with.
"""

from __future__ import annotations

from poisonq.timeline import BatchRun

FIRST = 100_000
MOST = 1_000_000  # 16 partitions of 62,500 messages: a task's rows as at 100,000 (source.py)


class BatchSizes:
    """The size of each lease of a run: ``batch_size`` for every one if given, else the
    growing sizes of the module docstring."""

    def __init__(self, batch_size: int | None) -> None:
        self.first = FIRST if batch_size is None else batch_size
        self.most = MOST if batch_size is None else batch_size
        self._failed = False  # the last batch run ran isolation jobs

    def next(self) -> int:
        """The size of the next lease, after the run's first (which takes :attr:`first`)."""
        return self.first if self._failed else self.most

    def ran(self, run: BatchRun) -> None:
        """Note how a batch went: one that needed isolation jobs brings the size back to
        :attr:`first`, and the next clean one grows it again."""
        self._failed = run.isolation_jobs > 0
