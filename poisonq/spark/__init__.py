"""poisonq on Spark: the ``poisonq`` data source, the pipeline runner and the streaming helper.

Needs the ``spark`` extra (``pip install 'poisonq[spark]'``).
"""

from __future__ import annotations

# First: on a PySpark outside the supported range, the imports below would fail on a module
# that names neither poisonq nor the release it needs.
from poisonq.spark import versions  # noqa: F401

# isort: split
from poisonq.spark.pipeline import Pipeline
from poisonq.spark.reports import PipelineInterrupted, PipelineReport, PipelineStoppedError
from poisonq.spark.restarting import run_restarting
from poisonq.spark.schema import MESSAGE_SCHEMA_DDL
from poisonq.spark.session import local_session
from poisonq.spark.source import PoisonqDataSource, register
from poisonq.spark.streaming import ForeachBatch, dead_letter, foreach_batch
from poisonq.spark.udf import udf

__all__ = [
    "MESSAGE_SCHEMA_DDL",
    "ForeachBatch",
    "Pipeline",
    "PipelineInterrupted",
    "PipelineReport",
    "PipelineStoppedError",
    "PoisonqDataSource",
    "dead_letter",
    "foreach_batch",
    "local_session",
    "register",
    "run_restarting",
    "udf",
]
