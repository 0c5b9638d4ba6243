"""Finding the members of a batch that fail alone, by bisection.

A batch handler (the :class:`~poisonq.processor.Processor`'s), a Spark job over a lease (the
pipeline runner) and a ``foreachBatch`` handler all fail as a whole, without saying which
message is to blame. Each runs the batch again in halves, down to single messages, and only
the messages that fail alone are settled as failures: k bad messages among n cost
O(k log n) runs. A right half whose left sibling passed is known to fail (its parent did) and
is split without being run whole, which saves one run per level.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

Item = TypeVar("Item")
Error = TypeVar("Error")


def failing_alone(
    batch: Sequence[Item],
    run: Callable[[Sequence[Item]], Error | None],
    *,
    known_to_fail: bool = False,
    found: Callable[[int, Error], None] | None = None,
) -> dict[int, Error]:
    """The positions in ``batch`` of the members that fail alone, each with the error it
    failed with alone. ``run(part)`` runs a part: ``None`` if it passed, else its error.
    ``known_to_fail``: the whole batch failed already, so it is split at once. ``found`` is
    told of each member found as soon as it is, and may raise to stop the search."""
    failing: dict[int, Error] = {}

    def search(lo: int, hi: int, known: bool) -> bool:
        """Whether ``batch[lo:hi]`` passed whole; records the members failing alone."""
        if not (known and hi - lo > 1):
            error = run(batch[lo:hi])
            if error is None:
                return True
            if hi - lo == 1:
                failing[lo] = error
                if found is not None:
                    found(lo, error)
                return False
        middle = (lo + hi) // 2
        left = search(lo, middle, known=False)
        search(middle, hi, known=left)
        return False

    if batch:
        search(0, len(batch), known_to_fail)
    return failing
