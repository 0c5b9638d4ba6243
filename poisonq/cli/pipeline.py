"""``poisonq pipeline run``: a user's transform over a queue on Spark, from the command line.

It runs every kind of :class:`~poisonq.spark.Pipeline`: a DataFrame transform
(``transform=``, with ``--expect`` for expectations) when no ``--schema`` is given, a function
of one message (``map=``) with ``--schema``, the schema of the row it returns, and a function
of an Arrow batch of messages (``map_batches=``) with ``--schema --batches``. Running one kind
as another is refused in one line before any message is leased: the function is applied to
an empty batch DataFrame first, as the pipeline does, and a per-row function fails or returns
something other than a DataFrame there, while a DataFrame transform returns one; and a
function given ``--schema`` is applied to an empty Arrow batch of messages before Spark
starts, where only a function of a batch returns rows (under the crash guard: one that kills
its process there is not applied to the DataFrame, which would be in this process).

PySpark is imported inside the command only, so every other command works without the
``spark`` extra and starts without loading it. Everything that can be checked without Spark
(the transform can be imported, the options fit its kind, the queue exists) is checked first,
so a typo costs no JVM start.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import keyword
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import click
from rich.table import Table
from rich.text import Text

from poisonq.cli.app import App
from poisonq.cli.output import emit, json_option, progress, table
from poisonq.defects import DEFAULT_MAX_FAILURE_RATIO
from poisonq.errors import InvalidOptionError, PoisonqError
from poisonq.failures import first_line
from poisonq.timeline import DEFAULT_KEEP, per_second

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from poisonq.spark.reports import PipelineReport

TARGET_HELP = "expected MODULE:FUNC or path/to/file.py:FUNC"
PERMANENT_HELP = "--permanent expects MODULE.Type, MODULE:Type or path/to/file.py:Type"
EXPECT_HELP = "--expect expects NAME=SQL, e.g. positive='amount > 0'"
_EXPECTATION_NAME = re.compile(r"[A-Za-z_][\w.-]*")
PER_ROW_HINT = "a function of one message (a dict) runs with --schema DDL, the schema of its row"


class SparkMissingError(PoisonqError):
    """``pipeline run`` and the Spark demo need PySpark, which the ``spark`` extra installs."""


# The transform ----------------------------------------------------------------------------
def load_transform(target: str) -> Callable[..., Any]:
    """The function named by ``MODULE:FUNC`` (imported as ``python -m`` would, with the
    current directory on the path) or ``path/to/file.py:FUNC``.

    A module loaded from a file is registered to be pickled by value: Spark's executors
    could not import it by name, so its functions travel with the job. A module imported by
    name is pickled by reference, as Spark does, and must be importable on the executors
    (in local mode they start in this directory). Raises :class:`InvalidOptionError` when
    the target is malformed, names a missing file, module or attribute, or its module does
    not compile or fails as it is imported (where it failed, in one line).
    """
    function = _load(target, TARGET_HELP)
    if not callable(function):
        raise InvalidOptionError(f"{target!r} is not a function but {type(function).__name__}")
    return cast("Callable[..., Any]", function)


def load_exception(target: str) -> type[BaseException]:
    """The exception class named by ``MODULE.Type``, ``MODULE:Type``, ``file.py:Type`` or a
    builtin's name (``ValueError``)."""
    if ":" not in target:
        module, _, name = target.rpartition(".")
        target = f"{module or 'builtins'}:{name}"
    found = _load(target, PERMANENT_HELP)
    if not (isinstance(found, type) and issubclass(found, BaseException)):
        raise InvalidOptionError(f"--permanent {target!r} is not an exception class")
    return found


def _load(target: str, usage: str) -> Any:
    module_name, sep, name = target.rpartition(":")
    if not sep or not module_name or not name.isidentifier():
        raise InvalidOptionError(f"{usage}, not {target!r}")
    from_file = module_name.endswith(".py") or "/" in module_name or os.sep in module_name
    try:
        try:
            module = _module_from_file(Path(module_name)) if from_file else _import(module_name)
        except Exception as exc:
            if getattr(exc, "getCondition", lambda: None)() != "SESSION_OR_CONTEXT_NOT_EXISTS":
                raise
            # The module builds a UDF (or parses a type) when imported, which needs a session.
            from poisonq.spark.session import local_session

            local_session()
            module = _module_from_file(Path(module_name)) if from_file else _import(module_name)
    except PoisonqError:
        raise
    except SyntaxError as exc:  # where, and what: all a user needs to fix it
        raise InvalidOptionError(
            f"{module_name} does not compile: {exc.msg} ({exc.filename}, line {exc.lineno})"
        ) from None
    except Exception as exc:  # the module's own code failed as it was imported
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        raise InvalidOptionError(
            f"importing {module_name} raised {type(exc).__name__}: {first_line(exc)}"
            f" ({frame.filename}, line {frame.lineno})"
        ) from None
    if not hasattr(module, name):
        raise InvalidOptionError(f"module {module_name!r} has no attribute {name!r}")
    return getattr(module, name)


def _module_from_file(path: Path) -> ModuleType:
    """The module of a file, loaded once: the transform and the exception types it raises
    (``--permanent file.py:Type``) must be the same classes."""
    if not path.is_file():
        raise InvalidOptionError(f"no such file {str(path)!r} ({TARGET_HELP})")
    path = path.resolve()
    name = _file_module_name(path)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise InvalidOptionError(f"cannot load {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    # In sys.modules while it runs, as an import would be: dataclasses and pickling need it.
    sys.modules[name] = module
    _FILE_MODULES.add(name)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    _ship_by_value(module)
    return module


_FILE_MODULES: set[str] = set()  # the names of the job files' modules loaded so far


def _file_module_name(path: Path) -> str:
    """The name a file's module goes by: its stem, as the user calls it and as its exception
    classes show in a failure (``rows.BadEvent``), unless another module has that name (a
    file called json.py must not replace the json module); then a private name made of its
    path. A job file of the same name loaded before (another run in the same process) is
    replaced."""
    stem = path.stem
    if stem.isidentifier() and not keyword.iskeyword(stem):
        loaded = sys.modules.get(stem)
        if loaded is not None and stem in _FILE_MODULES:
            if getattr(loaded, "__file__", None) != str(path):
                del sys.modules[stem]
            return stem
        if loaded is None and _findable(stem) in (None, str(path)):
            return stem
    return "poisonq_transform_" + re.sub(r"\W", "_", str(path))


def _findable(name: str) -> str | None:
    """Where an import of top-level module ``name`` would load it from, None if nowhere."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return None if spec is None else (spec.origin or "")


def _import(module_name: str) -> ModuleType:
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does; a console script lacks it
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise InvalidOptionError(f"cannot import {module_name!r}: {exc}") from None


def _ship_by_value(module: ModuleType) -> None:
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]


# Spark ------------------------------------------------------------------------------------
def require_pyspark() -> None:
    """Raise :class:`SparkMissingError` (one line, not a traceback) without PySpark."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise SparkMissingError(
            "this command needs PySpark: pip install 'poisonq[spark]'"
        ) from None


def _parse_schema(schema: str) -> StructType:
    """The output schema from Spark DDL; a parse error is the user's, so one line."""
    from pyspark.errors import PySparkException
    from pyspark.sql.types import StructType

    try:
        parsed = StructType.fromDDL(schema)
    except PySparkException as exc:
        first = first_line(exc)
        raise InvalidOptionError(f"--schema {schema!r} is not Spark DDL: {first}") from None
    if not isinstance(parsed, StructType):
        raise InvalidOptionError(f"--schema {schema!r} must list columns, not one type")
    return parsed


def parse_expectations(pairs: tuple[str, ...]) -> dict[str, str]:
    """``--expect NAME=SQL`` options as the pipeline's ``expectations``: split at the first
    ``=`` (the SQL may hold more), names unique."""
    expectations: dict[str, str] = {}
    for pair in pairs:
        name, sep, sql = pair.partition("=")
        name, sql = name.strip(), sql.strip()
        if not sep or not sql or not _EXPECTATION_NAME.fullmatch(name):
            raise InvalidOptionError(f"{EXPECT_HELP}, not {pair!r}")
        if name in expectations:
            raise InvalidOptionError(f"--expect {name!r} is given twice")
        expectations[name] = sql
    return expectations


def _probe(spark: SparkSession, function: Any) -> tuple[Any, DataFrame]:
    """``function`` applied to an empty batch DataFrame, as the pipeline applies a
    transform; what it returned or the exception it raised, and the batch."""
    from poisonq.spark.schema import MESSAGE_SCHEMA_DDL
    from poisonq.spark.session import quiet_query_errors

    batch = spark.createDataFrame([], MESSAGE_SCHEMA_DDL)
    try:
        with quiet_query_errors():
            return function(batch), batch
    except Exception as exc:  # a per-row function given a DataFrame, or the user's bug
        return exc, batch


def check_dataframe_transform(spark: SparkSession, target: str, function: Any) -> None:
    """Refuse, in one line, a per-row function run without ``--schema``, in the command
    line's words (the pipeline then checks the rest of the plan, expectations too, before
    a message is leased)."""
    from pyspark.errors import PySparkException
    from pyspark.sql import DataFrame

    out, _ = _probe(spark, function)
    if isinstance(out, PySparkException):
        first = first_line(out)
        raise InvalidOptionError(f"{target} failed on the batch DataFrame: {first}")
    if isinstance(out, Exception):
        raise InvalidOptionError(
            f"{target} is not a DataFrame transform (run without --schema, it gets the batch"
            f" as a DataFrame): it raised {out!r}; {PER_ROW_HINT}"
        )
    if not isinstance(out, DataFrame):
        raise InvalidOptionError(
            f"{target} is not a DataFrame transform (run without --schema, it gets the batch"
            f" as a DataFrame): it returned a {type(out).__name__}; {PER_ROW_HINT}"
        )


def check_per_row_function(spark: SparkSession, target: str, function: Any) -> None:
    """Refuse, in one line, a DataFrame transform given ``--schema``: applied to a batch
    DataFrame it returns a new DataFrame, which no function of one message does."""
    from pyspark.sql import DataFrame

    out, batch = _probe(spark, function)
    if isinstance(out, DataFrame) and out is not batch:
        raise InvalidOptionError(
            f"{target} is a DataFrame transform (it returns a DataFrame given the batch as"
            " one), and --schema is for a function of one message: drop --schema (the"
            " output is the DataFrame it returns)"
        )


def check_not_a_batch_function(target: str, function: Any, batches: bool) -> bool:
    """Refuse, in one line and before Spark starts, a function of a batch given ``--schema``
    without ``--batches``: it would be called with each message (a dict) and fail on all of
    them, which the run would find a defect only after starting Spark and leasing a batch.
    Returns whether the function outlived the empty batch it was tried on (under the crash
    guard): one that killed its process is not tried on the batch DataFrame either, which
    would be in this process."""
    from poisonq.spark.batches import try_on_a_batch

    answer = try_on_a_batch(function)
    if answer and not batches:
        raise InvalidOptionError(
            f"{target} is a function of a batch (given an empty Arrow batch of messages, it"
            " returns rows): run it with --batches, or make it take one message (a dict)"
        )
    return answer is not None


def _quiet_py4j_interrupt(record: logging.LogRecord) -> bool:
    """py4j logs a Ctrl-C in the middle of a call to the JVM as an error, with a traceback;
    the report that follows says the run was interrupted, and what it left."""
    return record.getMessage() != "KeyboardInterrupt while sending command."


# The report -------------------------------------------------------------------------------
def _interrupted_line(report: PipelineReport, consumer: str) -> str:
    """What Ctrl-C left, in one line: the batch in hand is replayed by the next run, which
    first watches its lock for up to half the lock duration (no other run may hold it)."""
    if not report.unfinished:
        return "interrupted: nothing left unfinished"
    return (
        f"interrupted: the batch in hand ({report.unfinished} message(s)) stays locked and is"
        f" replayed by the next run of consumer {consumer!r}, after up to half a lock duration"
        " making sure no other run holds it"
    )


def _report_json(report: PipelineReport, interrupted: bool) -> dict[str, Any]:
    data = {f.name: getattr(report, f.name) for f in dataclasses.fields(report)}
    data["dead_lettered"] = dict(report.dead_lettered)
    data["messages_per_second"] = report.messages_per_second
    data["interrupted"] = interrupted
    return data


def _report_table(title: str, report: PipelineReport) -> Table:
    rows: list[tuple[str, Any]] = [
        ("batches", report.batches),
        ("leased", report.leased),
        ("completed", report.completed),
        ("retried", report.retried),
        ("given back", report.released),
        *([("unfinished (replayed next run)", report.unfinished)] if report.unfinished else []),
        ("dead-lettered", report.dead_lettered.total()),
        *((f"  {reason or '(none)'}", n) for reason, n in report.dead_lettered.most_common()),
        ("isolation jobs", report.isolation_jobs),
        ("elapsed (s)", f"{report.elapsed:.1f}"),
        ("msgs/s", per_second(report.messages_per_second)),
    ]
    return table(title, ["measure", "value"], rows)


def _summary(report: PipelineReport) -> str:
    return (
        f"{report.batches} batch(es) · {report.leased} leased · {report.completed} completed · "
        f"{report.retried} retried · {report.dead_lettered.total()} dead-lettered · "
        f"{per_second(report.messages_per_second)} msgs/s"
    )


# The command ------------------------------------------------------------------------------
def _given(ctx: click.Context, name: str) -> bool:
    """Whether option ``name`` was given on the command line (not its default)."""
    return ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE


@click.group()
def pipeline() -> None:
    """Run Spark pipelines over a queue."""


@pipeline.command("run")
@click.argument("target", metavar="MODULE:FUNC")
@click.option("--queue", "queue_name", required=True, help="The queue to consume.")
@click.option(
    "--schema",
    metavar="DDL",
    help="FUNC is a function of one message returning one row of this Spark DDL, e.g."
    " 'order_id string, total double'. Without it, FUNC is a DataFrame transform.",
)
@click.option(
    "--expect",
    "expect",
    multiple=True,
    metavar="NAME=SQL",
    help="An expectation on each output row of a DataFrame transform (repeatable), e.g."
    " positive='amount > 0': a row for which the SQL is false or NULL dead-letters its"
    " message (ExpectationFailed), none of its rows written.",
)
@click.option(
    "--output", required=True, metavar="PATH", help="Output directory (one part per batch)."
)
@click.option(
    "--consumer",
    default="pipeline",
    show_default=True,
    help="Consumer name: a rerun replays this consumer's unfinished batch first.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    help="Most messages per batch (one lease, one Spark job) [default: 100,000 for a run's"
    " first batch and after a batch whose job failed, else 1,000,000: a backlog goes in few"
    " jobs].",
)
@click.option(
    "--lock-duration",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds a batch's locks last, renewed while it runs [default: the queue's].",
)
@click.option(
    "--format",
    "output_format",
    default="parquet",
    show_default=True,
    help="Spark output format.",
)
@click.option(
    "--permanent",
    "permanent_types",
    multiple=True,
    metavar="MODULE.Type",
    help="An exception type that dead-letters at once instead of being retried"
    " (repeatable), e.g. json.JSONDecodeError or transforms.py:InvalidOrder; raised by a"
    " per-row FUNC or a poisonq.spark.udf.",
)
@click.option(
    "--batches",
    is_flag=True,
    help="With --schema: FUNC takes an Arrow RecordBatch of messages and returns its rows"
    " (a RecordBatch, Table or pandas DataFrame), or (rows, errors) with an error or None per"
    " message, the rows then one per message or each with its message's sequence_number"
    " (map_batches=; docs/spark.md).",
)
@click.option(
    "--ignore-extra-fields",
    is_flag=True,
    help="With --schema: drop keys of a returned dict that the schema does not have,"
    " instead of dead-lettering the message (OutputSchemaMismatch).",
)
@click.option(
    "--max-failure-ratio",
    type=click.FloatRange(min=0, max=1, min_open=True),
    default=DEFAULT_MAX_FAILURE_RATIO,
    show_default=True,
    help="Stop when more than this share of a batch fails the same way (a bug, not poison):"
    " its messages go back to the queue without a delivery counted. 1: never stop.",
)
@click.option(
    "--isolate/--no-isolate",
    default=True,
    show_default=True,
    help="With --schema: run FUNC in a forked child, so a crashing message is isolated,"
    " not the batch.",
)
@click.option(
    "--forever",
    is_flag=True,
    help="Keep waiting for messages when the queue is idle; Ctrl-C stops.",
)
@click.option(
    "--keep-batches",
    type=click.IntRange(min=1),
    default=DEFAULT_KEEP,
    show_default=True,
    help="Batches of this consumer the store keeps in its timeline (poisonq pipeline show).",
)
@click.option(
    "--quiet",
    is_flag=True,
    help="No live progress line on a terminal (messages/s and dead-letters so far).",
)
@click.option(
    "--verbose",
    is_flag=True,
    help="Log the errors of the run's Spark jobs as Spark does, with their Java and Python"
    " stacks (without it, one line per failed batch and per isolated message).",
)
@json_option
@click.pass_context
def pipeline_run(
    ctx: click.Context,
    /,
    target: str,
    queue_name: str,
    schema: str | None,
    expect: tuple[str, ...],
    output: str,
    consumer: str,
    batch_size: int | None,
    lock_duration: float | None,
    output_format: str,
    permanent_types: tuple[str, ...],
    batches: bool,
    ignore_extra_fields: bool,
    max_failure_ratio: float,
    isolate: bool,
    forever: bool,
    keep_batches: int,
    quiet: bool,
    verbose: bool,
    as_json: bool,
) -> None:
    """Run a transform over a queue on Spark.

    Imports FUNC from MODULE (a module path or a .py file). Good rows are written to
    --output/consumer=NAME/lease=N, one directory per batch (a lease of up to --batch-size
    messages, one Spark job). FUNC is one of two kinds:

    A DataFrame transform (no --schema) gets the batch as a DataFrame of the messages (body
    as binary, sequence_number, subject, properties, ...) and returns the output DataFrame,
    in Spark SQL (from_json, joins, poisonq.spark.udf). Each output row keeps the
    sequence_number of its message, which is written with the rest. A row failing an
    --expect dead-letters its message (ExpectationFailed); an exception in a
    poisonq.spark.udf abandons the row's message (dead-letters it if permanent); anything
    else that fails the Spark job (an ANSI cast error, raise_error, a plain UDF) is isolated
    by bisection and only the messages failing alone are abandoned.

    \b
      # orders.py
      from pyspark.sql import functions as F
      def orders(batch):
          order = F.from_json(F.col("body").cast("string"), "id long, amount double")
          return batch.select("sequence_number", order.alias("o")).select(
              "sequence_number", "o.*")
    \b
      poisonq pipeline run orders.py:orders --queue orders --output out \\
          --expect positive='amount > 0' --expect has_id='id IS NOT NULL'

    A per-row function (with --schema) gets each message as a dict (body as bytes, subject,
    properties, ...) and returns one row of --schema (a dict with every field, or a
    tuple/list/Row by position), or None to skip it. A message whose FUNC raises a
    PermanentError (or a --permanent type), or returns a row that does not fit --schema, is
    dead-lettered at once; any other error is retried by the queue's policy. With
    --batches, FUNC takes an Arrow RecordBatch of messages instead (map_batches=); a
    function of a batch given --schema without --batches is refused before Spark starts.

    \b
      # rows.py
      import json
      def order(message):
          o = json.loads(message["body"])
          return {"id": o["id"], "amount": o["amount"]}
    \b
      poisonq pipeline run rows.py:order --queue orders --output out \\
          --schema 'id long, amount double' --permanent json.JSONDecodeError

    Either kind is first applied to an empty batch DataFrame (a function given --schema
    first to an empty Arrow batch of messages, in a child process, so one that kills its
    process there does not end the command), so running one as the other is refused before
    any message is leased. When most of a batch fails the same way (a
    bug, not poison), the run stops with the error and its traceback and the batch goes
    back to the queue without a delivery counted. Runs until the queue is idle, then prints
    what it did; on a terminal a live line shows the messages per second and the
    dead-letters so far (--quiet: none). Ctrl-C stops and prints the report so far; an
    unfinished batch is replayed by the next run. Each batch is recorded in the consumer's
    timeline: poisonq pipeline show CONSUMER.
    """
    app: App = ctx.obj
    require_pyspark()
    per_row = schema is not None
    expectations = parse_expectations(expect)
    from poisonq.spark.kinds import COMMAND_LINE, OfMessages, check_options

    if batches and not per_row:
        raise InvalidOptionError(
            "--batches goes with --schema (a function of a batch of messages returns rows of"
            " that schema)"
        )
    check_options(
        COMMAND_LINE,
        of_messages=(
            None if not per_row else OfMessages.MAP_BATCHES if batches else OfMessages.MAP
        ),
        schema=per_row,
        expectations=bool(expectations),
        ignore_extra_fields=ignore_extra_fields,
        isolate=_given(ctx, "isolate"),
    )
    function = load_transform(target)
    survives = per_row and check_not_a_batch_function(target, function, batches)
    permanent = tuple(load_exception(name) for name in permanent_types)
    app.broker.get_queue(queue_name)  # an unknown queue fails here, before Spark starts
    from poisonq.spark.pipeline import Pipeline
    from poisonq.spark.reports import PipelineInterrupted, PipelineStoppedError
    from poisonq.spark.session import local_session, show_job_errors

    spark = local_session()
    if verbose:
        show_job_errors()
    common: dict[str, Any] = {
        "url": app.url,
        "queue": queue_name,
        "output": output,
        "consumer": consumer,
        "batch_size": batch_size,
        "lock_duration": lock_duration,
        "output_format": output_format,
        "permanent": permanent,
        "max_failure_ratio": None if max_failure_ratio == 1 else max_failure_ratio,
        "keep_batches": keep_batches,
        "retry_total": app.retry_total,
    }
    if schema is not None:
        struct = _parse_schema(schema)
        if survives:
            check_per_row_function(spark, target, function)
        common["map_batches" if batches else "map"] = function
        runner = Pipeline(
            spark,
            schema=struct,
            isolate=isolate if _given(ctx, "isolate") else None,
            ignore_extra_fields=ignore_extra_fields,
            **common,
        )
    else:
        check_dataframe_transform(spark, target, function)
        runner = Pipeline(spark, transform=function, expectations=expectations, **common)
    logging.getLogger().addFilter(_quiet_py4j_interrupt)
    with progress(app, f"pipeline {queue_name}", quiet=quiet) as update:

        def on_batch(report: PipelineReport) -> None:
            update(report.leased, None, _summary(report))

        try:
            report, interrupted = runner.run(until_idle=not forever, progress=on_batch), False
        except PipelineStoppedError as exc:
            if exc.traceback:  # once, before the one red line the root prints
                app.err.print(Text(exc.traceback.rstrip(), style="dim"), soft_wrap=True)
            raise
        except PipelineInterrupted as exc:
            report, interrupted = exc.report, True
    if interrupted:
        app.err.print(_interrupted_line(report, consumer), soft_wrap=True)
    title = f"pipeline {queue_name} → {output}" + (" (interrupted)" if interrupted else "")
    emit(app, as_json, _report_json(report, interrupted), lambda: _report_table(title, report))
    if interrupted and not forever:  # (with --forever, Ctrl-C is how a run ends)
        raise SystemExit(130)  # as a shell reports a command stopped by Ctrl-C
