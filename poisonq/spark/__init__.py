"""poisonq on Spark: the ``poisonq`` data source and the pipeline runner.

Needs the ``spark`` extra (``pip install 'poisonq[spark]'``).
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from poisonq.spark.pipeline import Pipeline, PipelineReport, PipelineStoppedError
from poisonq.spark.schema import MESSAGE_SCHEMA_DDL
from poisonq.spark.session import local_session
from poisonq.spark.source import PoisonqDataSource
from poisonq.spark.udf import udf


def register(spark: SparkSession) -> None:
    """Make ``format("poisonq")`` known to this session."""
    spark.dataSource.register(PoisonqDataSource)


__all__ = [
    "MESSAGE_SCHEMA_DDL",
    "Pipeline",
    "PipelineReport",
    "PipelineStoppedError",
    "PoisonqDataSource",
    "local_session",
    "register",
    "udf",
]
