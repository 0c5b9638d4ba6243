"""What runs in Spark's Python workers for the per-message ``map``, kept free of PySpark.

The crash guard (:mod:`poisonq.worker.guard`) runs a transform in the children of a lean
helper process (:mod:`poisonq.worker.child`; the transform rebuilt there without cloudpickle,
:mod:`poisonq.worker.rebuild`), a new child per crash, the rows and results in
memory they share (:mod:`poisonq.worker.shared`); the lease rows it takes
(:mod:`poisonq.worker.lease_rows`) become the messages a transform gets, and a transform's
exception in a child goes to the caller as data, which the caller records
(:mod:`poisonq.worker.raised`). A fork costs in proportion to the memory of the process
forked, so nothing here imports pyspark, pyarrow or the store: importing
:mod:`poisonq.spark` would. Nor does what the helper loads import ``threading`` or
``logging`` (so neither :mod:`poisonq.model` nor cloudpickle; the caller's side,
:mod:`poisonq.worker.guard`, may): their fork handlers run in every child.
"""
