"""The PySpark releases poisonq's Spark features work on, checked as ``poisonq.spark`` is imported.

The oldest is 4.2: the streaming source takes one lease of at most ``maxMessagesPerBatch``
messages per micro-batch through the Python data source's admission control
(``latestOffset(start, limit)`` and ``getDefaultReadLimit``), learns from ``start`` that the
previous batch committed, and reads what a queue holds in batches under
``trigger(availableNow=True)`` through ``SupportsTriggerAvailableNow``; PySpark added all three
in 4.2 (4.0 and 4.1 call ``latestOffset()`` with no argument and have no ``availableNow`` for
Python sources). The range ends before 5, the next major release, untested. The ``spark``
extra in pyproject.toml states the same range, and a test proves they agree.

Installed into an existing Spark runtime without the extra, poisonq finds whatever PySpark is
there: an older one would fail on a missing module that names neither poisonq nor versions,
so the check says which release is needed.
"""

from __future__ import annotations

import re

import pyspark

from poisonq.errors import UnsupportedPySparkError

OLDEST = (4, 2)
BEYOND = (5, 0)
SUPPORTED = f">={OLDEST[0]}.{OLDEST[1]},<{BEYOND[0]}"


def check(version: str) -> None:
    """Raise :class:`~poisonq.errors.UnsupportedPySparkError` unless ``version`` (``4.2.0``,
    ``4.3.0.dev1``, a vendor's ``4.2.1+build``) is in the supported range."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None or not OLDEST <= (int(found[1]), int(found[2])) < BEYOND:
        raise UnsupportedPySparkError(version, SUPPORTED)


check(pyspark.__version__)
