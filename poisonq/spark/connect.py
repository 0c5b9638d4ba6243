"""What of poisonq's Spark runtime works from a Spark Connect client, and a clear error for
what does not.

Over Connect the client has no SparkContext and no JVM: the data source (read, readStream,
write), the pipeline runner with ``map=`` and the streaming helper (whose function Spark runs
in a Python process of the server's) only build plans and register data sources, which a
Connect session does too. The runner's ``transform=`` collects, from the gates of a batch's
tasks, which messages they passed, through an accumulator, which needs the SparkContext; a
Connect session refuses that with an ``AttributeError`` from deep inside, so the runner
checks first (:func:`require_classic`) and says what to do instead.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from poisonq.errors import InvalidOperationError


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client's session (``builder.remote``)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def require_classic(spark: SparkSession, what: str, instead: str) -> None:
    """:class:`InvalidOperationError` if ``spark`` is a Connect session: ``what`` needs the
    SparkContext; ``instead`` says what to use."""
    if is_connect(spark):
        raise InvalidOperationError(
            f"{what} needs the SparkContext (an accumulator), which a Spark Connect session"
            f" does not have; {instead}"
        )
