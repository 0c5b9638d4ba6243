"""Finding the messages that fail a batch alone, and telling them from a defect.

When a batch fails as a whole (a Spark job error in the pipeline runner, an exception from a
``foreachBatch`` handler in :mod:`poisonq.spark.streaming`), nothing says which message is
to blame. Both run the batch again in parts by sequence range, bisecting
(:mod:`poisonq.bisection`), until the messages whose parts fail alone are found
(:func:`isolate`); only those are settled as failures, so a
poison message never takes its neighbours' deliveries.

Bisecting a broken job (a sink that cannot be written, a transform that cannot be loaded)
would cost two jobs per message and abandon every one of them, so :func:`isolate` first runs
the first and the last message on its first delivery alone: when both fail the way the batch
did, it is a defect (:mod:`poisonq.defects`), and so is a batch in which more than
:data:`MAX_GUILTY_PER_BATCH` first deliveries, or all of at least three, fail alone. Messages
delivered before are suspects already: a batch of them failing is poison coming back, and
each is tried alone before the rest of the batch is bisected. Each message found gets the
error of its own part, not the batch's, and is settled by it (:func:`isolated_settlement`):
an error that depends only on the row's data is dead-lettered at once, anything else is
abandoned to the queue's retry policy.
"""

from __future__ import annotations

import builtins
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Sequence

from py4j.protocol import Py4JError
from pyspark.errors import PySparkException

from poisonq.bisection import failing_alone
from poisonq.defects import Defect
from poisonq.errors import PermanentError
from poisonq.failures import dead_lettering, describe
from poisonq.limits import MAX_MESSAGE, MAX_TRACEBACK, tail
from poisonq.model import Abandon, DeadLetter, FailureRecord

log = logging.getLogger(__name__)
JobError = (PySparkException, Py4JError)
MAX_GUILTY_PER_BATCH = 16
_JVM_FRAME = re.compile(r"\s+(at |\.\.\. \d+ more)")
# The first Python traceback in a job error: its frames (indented) and its exception line.
_PYTHON_TRACEBACK = re.compile(
    r"Traceback \(most recent call last\):\n(?:[ \t].*\n)+(?P<error>\S.*)"
)
_PYTHON_FRAME = re.compile(r'^\s+File "([^"]+)", line \d+, in (\S+)', re.M)

# Spark's error classes that depend only on the values of the row that raised them: a job
# failing alone on one message with one of them fails the same way on every delivery, so the
# message is dead-lettered on its first isolation (docs/spark.md lists them). Crashes,
# resources, I/O and anything else that may pass another time keep the retry policy.
DATA_ERROR_CLASSES = frozenset(
    {
        "ARITHMETIC_OVERFLOW",
        "BINARY_ARITHMETIC_OVERFLOW",
        "CANNOT_PARSE_DECIMAL",
        "CANNOT_PARSE_INTERVAL",
        "CANNOT_PARSE_JSON_FIELD",
        "CANNOT_PARSE_TIME",
        "CANNOT_PARSE_TIMESTAMP",
        "CAST_INVALID_INPUT",
        "CAST_OVERFLOW",
        "CAST_OVERFLOW_IN_TABLE_INSERT",
        "CONVERSION_INVALID_INPUT",
        "DATETIME_FIELD_OUT_OF_BOUNDS",
        "DATETIME_OVERFLOW",
        "DIVIDE_BY_ZERO",
        "DUPLICATED_MAP_KEY",
        "ILLEGAL_DAY_OF_WEEK",
        "INTERVAL_ARITHMETIC_OVERFLOW",
        "INTERVAL_DIVIDED_BY_ZERO",
        "INVALID_ARRAY_INDEX",
        "INVALID_ARRAY_INDEX_IN_ELEMENT_AT",
        "INVALID_FRACTION_OF_SECOND",
        "INVALID_INDEX_OF_ZERO",
        "INVALID_INTERVAL_FORMAT",
        "INVALID_URL",
        "INVALID_UTF8_STRING",
        "INVALID_VARIANT_CAST",
        "MALFORMED_CHARACTER_CODING",
        "MALFORMED_RECORD_IN_PARSING",
        "NULL_MAP_KEY",
        "NUMERIC_OUT_OF_SUPPORTED_RANGE",
        "NUMERIC_VALUE_OUT_OF_RANGE",
        "REMAINDER_BY_ZERO",
        "USER_RAISED_EXCEPTION",
    }
)
_ERROR_CLASS = re.compile(r"\[([A-Z][A-Z0-9_.]+)\]")
_EXCEPTION_TYPE = re.compile(r"([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))\b")

# The fingerprints of job failures (:func:`job_failure`): a message that left one failed a
# whole Spark job alone on an earlier delivery.
JOB_FAILURE_FINGERPRINTS = ("batch-job-failed", "crash-in-spark-job")

# Runs a part of the batch (sorted sequence numbers): None if it passed, else its error.
Probe = Callable[[list[int]], BaseException | None]


class _NotPoison(Exception):
    """Isolation found more guilty messages than poison explains."""


def isolate(
    held: Sequence[int], fresh: Sequence[int], error: BaseException, fails: Probe
) -> dict[int, BaseException] | Defect:
    """The messages of ``held`` (sorted) whose parts fail alone, each with the error it
    failed with alone, or the defect the batch shows (see the module docstring). ``fresh``
    are the first deliveries among them, ``error`` the batch's own failure: a batch of one
    message failed alone already, and costs no job."""
    if len(held) == 1:  # the batch's own job ran it alone
        return {held[0]: error}
    fresh_set = set(fresh)
    signature = _signature(error)
    guilty: dict[int, BaseException] = {}

    if len(fresh) >= 3:
        probes = [fails([seq]) for seq in (fresh[0], fresh[-1])]
        if all(p is not None and _signature(p) == signature for p in probes):
            return job_defect(error, fresh)

    def search(part: list[int], known_to_fail: bool) -> None:
        def probe(members: Sequence[int]) -> BaseException | None:
            return fails(list(members))

        def found(position: int, failure: BaseException) -> None:
            guilty[part[position]] = failure
            if len(fresh_set.intersection(guilty)) > MAX_GUILTY_PER_BATCH:
                raise _NotPoison from None

        failing_alone(part, probe, known_to_fail=known_to_fail, found=found)

    # Messages delivered before come back because they failed: try them alone first, so
    # poison coming back costs a job each, not a bisection of the batch around it.
    suspects = [seq for seq in held if seq not in fresh_set][:MAX_GUILTY_PER_BATCH]
    tried = set(suspects)
    rest = [seq for seq in held if seq not in tried]
    try:
        for seq in suspects:
            search([seq], False)
        if rest:
            search(rest, not suspects)  # the whole batch is known to fail
    except _NotPoison:
        found_alone = len(fresh_set.intersection(guilty))
        return Defect(job_failure(error), found_alone, len(fresh), alone=True)
    if len(fresh) >= 3 and fresh_set.issubset(guilty):
        return job_defect(error, fresh)
    return guilty


def data_error_class(error: BaseException) -> str | None:
    """The error class of a job's failure (without its subclass: ``NUMERIC_VALUE_OUT_OF_RANGE``
    of ``NUMERIC_VALUE_OUT_OF_RANGE.WITH_SUGGESTION``) if it is one of
    :data:`DATA_ERROR_CLASSES`: Spark's own condition, or the ``[CLASS]`` a wrapped error
    starts with. A Python exception raised in the driver has none."""
    if not isinstance(error, JobError):
        return None
    condition = getattr(error, "getCondition", None)
    name = condition() if callable(condition) else None
    if not name:
        found = _ERROR_CLASS.search(job_failure(error).message)
        name = found.group(1) if found else ""
    base = name.split(".", 1)[0]
    return base if base in DATA_ERROR_CLASSES else None


def isolated_settlement(
    seq: int,
    lock_token: str,
    error: BaseException,
    failure: FailureRecord,
    permanent: tuple[type[BaseException], ...] = (),
) -> Abandon | DeadLetter:
    """How a message found failing a job alone is settled: dead-lettered at once when the
    error is permanent (a :class:`~poisonq.PermanentError` or one of ``permanent``, raised on
    the driver or in a Python worker of the job: :func:`raised_type`), with its class as the
    reason; or when the error depends only on the data (:func:`data_error_class`), with the
    error class as its reason and Spark's message (with the value) as its description;
    else abandoned with ``failure``, so the queue's retry policy applies."""
    kinds: tuple[type[BaseException], ...] = (PermanentError, *permanent)
    if isinstance(error, kinds):
        return dead_lettering(seq, lock_token, failure)
    raised = raised_type(error)
    if raised is not None and issubclass(raised, kinds):
        return DeadLetter(seq, lock_token, raised.__name__, describe(failure), failure)
    kind = data_error_class(error)
    if kind is None:
        return Abandon(seq, lock_token, failure)
    return DeadLetter(seq, lock_token, kind, failure.message, failure)


def raised_type(error: BaseException) -> type[BaseException] | None:
    """The class of the Python exception a Python worker raised in a failed Spark job,
    looked up by the name its traceback gives among the driver's loaded modules (a job's
    functions come from the driver's code), so that ``permanent=`` types and
    :class:`~poisonq.PermanentError` subclasses raised in a UDF or ``mapInArrow`` are told as
    they are on the driver. None if there is no such traceback or no such class here."""
    if not isinstance(error, JobError):
        return None
    found = _PYTHON_TRACEBACK.search(str(error))
    if found is None:
        return None
    name = found.group("error").split(":", 1)[0].strip()
    module, _, qualname = name.rpartition(".")
    while module and module not in sys.modules:  # a nested class: Outer.Inner
        module, _, outer = module.rpartition(".")
        qualname = f"{outer}.{qualname}"
    homes = [sys.modules[module]] if module else [builtins, sys.modules.get("__main__")]
    for home in homes:
        found_class: object = home
        for part in qualname.split("."):
            found_class = getattr(found_class, part, None)
        if isinstance(found_class, type) and issubclass(found_class, BaseException):
            return found_class
    return None


def report_isolated(batch: str, settlements: Sequence[Abandon | DeadLetter]) -> None:
    """One line on the console for each message found failing alone, with its failure's
    one line (no stack: the failure keeps its traceback), and the reason when it was
    dead-lettered at once rather than given back to the retry policy."""
    for settled in settlements:
        match settled:
            case DeadLetter(reason=reason, description=line):
                line = f"dead-lettered {reason}: {line}"
            case Abandon(failure=failure) if failure is not None:
                line = describe(failure)
            case _:
                continue
        log.warning("%s: message %d failed alone: %s", batch, settled.sequence_number, line)


def _signature(error: BaseException) -> str:
    """What two job failures share when they fail the same way: the error's first line
    without the numbers that name stages, tasks and hosts."""
    return re.sub(r"\d+", "#", job_failure(error).message)


def job_defect(error: BaseException, held: Sequence[int]) -> Defect:
    return Defect(job_failure(error), len(held), len(held))


def worker_crashed(error: BaseException) -> bool:
    """Whether a Spark job failed because a Python worker died (``os._exit``, a segfault,
    the out-of-memory killer) rather than because of an exception."""
    java = getattr(error, "java_exception", None)
    text = f"{error}\n{java.toString() if java is not None else ''}"
    return "worker exited unexpectedly" in text.lower()


def job_failure(error: BaseException) -> FailureRecord:
    """The failure a Spark job error leaves on a message. A Python worker's death is a
    crash (:func:`crash_failure`). When a Python traceback is in it (a Python worker
    failed), that traceback and its exception line; else the error's first line and its
    chain of errors without the JVM's frames."""
    if worker_crashed(error):
        return crash_failure(error)
    text = str(error).strip()
    java = getattr(error, "java_exception", None)  # a Py4JJavaError's message is only "o42.save"
    summary = str(java.toString()) if java is not None else text
    lines = [line.strip() for line in summary.splitlines() if line.strip()]
    first = lines[0] if lines else type(error).__name__
    if first.endswith(":") and len(lines) > 1:  # "Python worker exited unexpectedly (crashed):"
        first = f"{first} {lines[1]}"
    chain = "\n".join(line for line in text.splitlines() if not _JVM_FRAME.match(line))
    python = _PYTHON_TRACEBACK.search(text)
    if python is not None:
        first, chain = python.group("error"), python.group(0)
    return FailureRecord(
        time.time(),
        "BatchJobFailed",
        first[:MAX_MESSAGE],
        traceback=tail(chain, MAX_TRACEBACK),
        fingerprint=_job_fingerprint(first, python),
    )


def _job_fingerprint(first: str, python: re.Match[str] | None) -> str:
    """How a job failure is grouped: by the Python exception's type and the frame that
    raised it (file and function, as :func:`poisonq.failures.fingerprint` groups the
    failures of ``map=``) when a Python traceback is there; else by Spark's error class
    (``[CAST_INVALID_INPUT]``, the same wherever the expression is) or the exception's type."""
    if python is not None:
        frames = _PYTHON_FRAME.findall(python.group(0))
        kind = first.split(":", 1)[0].strip()
        if frames and kind:
            path, function = frames[-1]
            return f"{JOB_FAILURE_FINGERPRINTS[0]}:{kind}@{os.path.basename(path)}:{function}"
    found = _ERROR_CLASS.search(first) or _EXCEPTION_TYPE.match(first)
    return JOB_FAILURE_FINGERPRINTS[0] + (f":{found.group(1)}" if found else "")


def same_job_failure(before: str, now: str) -> bool:
    """Whether a job failure fingerprinted ``now`` fails as the one ``before`` did. A record
    from before fingerprints named the frame (``batch-job-failed:ValueError``) is read as
    its type: a message that failed so then is judged by the type it fails with now."""
    return now == before or ("@" not in before and now.partition("@")[0] == before)


# A streaming query's error: Spark's wrapper line, the cause, then the query's state.
_STREAM_FAILED = re.compile(r"^\[STREAM_FAILED\] Query \[[^\]]*\] terminated with exception: ")
_QUERY_STATE = "\n=== Streaming Query ==="


class _QueryCause(Exception):
    """The error a streaming query died of, as the text Spark gives of it."""


def query_failure(error: BaseException) -> FailureRecord:
    """The failure a plain streaming query's error (a ``StreamingQueryException``) leaves on
    a message: :func:`job_failure` of the cause Spark wraps it around (``[STREAM_FAILED]
    Query [...] terminated with exception: ...``, then the query's state and plan), so that
    it is told, traced and fingerprinted as the same error in the pipeline's job is."""
    cause = _STREAM_FAILED.sub("", str(error).split(_QUERY_STATE, 1)[0]).strip()
    return job_failure(_QueryCause(cause))


_CRASHED = re.compile(
    r"worker exited unexpectedly \(crashed\):(?P<log>.*?)(?:\n\s*\n|$)", re.I | re.S
)


def crash_failure(error: BaseException) -> FailureRecord:
    """A Python worker's death in a Spark job, told as the crash guard tells one under
    ``map=`` (``WorkerCrashed``), not as the Java error that carries it. Spark does not pass
    on the worker's exit status; its fault handler's first line (a segfault's
    ``Fatal Python error: Segmentation fault``) is there when the worker printed one."""
    java = getattr(error, "java_exception", None)
    found = _CRASHED.search(str(java.toString()) if java is not None else str(error))
    log = found.group("log").strip() if found else ""
    first = log.splitlines()[0] if log else ""
    how = "" if first.startswith(("at ", "Caused by")) else first
    return FailureRecord(
        time.time(),
        "WorkerCrashed",
        "the Python process handling this message died"
        + (f" ({how})" if how else " (its exit status is not reported by Spark)"),
        traceback=tail(log, MAX_TRACEBACK),
        fingerprint=JOB_FAILURE_FINGERPRINTS[1],
    )
