"""Makes ``format("poisonq")`` known in every SparkSession where poisonq is installed.

PySpark 4 imports each top-level module named ``pyspark_*`` the first time a session needs a
Python data source and registers the module's ``DefaultSource`` under its name, so a notebook,
a ``spark-submit`` job or a cluster needs no ``poisonq.spark.register(spark)``. Spark imports
every such module it finds; one that failed to import would hide all the others, so without
poisonq's ``spark`` extra this module defines nothing.
"""

from __future__ import annotations

try:
    from poisonq.spark.source import PoisonqDataSource as DefaultSource
except ImportError:  # pragma: no cover - pyspark without pyarrow: nothing to offer
    pass
else:
    __all__ = ["DefaultSource"]
