"""What runs in Spark's Python workers for the per-message ``map``, kept free of PySpark.

The crash guard (:mod:`poisonq.worker.guard`) runs a transform in the children of a lean
helper process (:mod:`poisonq.worker.child`), a new child per crash, the rows and results in
memory they share (:mod:`poisonq.worker.shared`); the lease rows it takes
(:mod:`poisonq.worker.lease_rows`) become the messages a transform gets, and a transform's
exception in a child goes to the caller as data, which the caller records
(:mod:`poisonq.worker.raised`). A fork costs in proportion to the memory of the process
forked, so nothing here imports pyspark, pyarrow or the store: importing
:mod:`poisonq.spark` would.
"""
