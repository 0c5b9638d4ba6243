"""The two kinds of pipeline function and the options each takes: the rules stated once,
for ``Pipeline`` and the command line, each naming the options in its own words.

A DataFrame transform (``transform=``) returns the output DataFrame, checked by
expectations; a per-row function (``map=``) returns one row of ``schema=``, checked against
it, and may drop a dict's extra keys or run without the crash guard. Nothing here needs a
Spark session, so the command line refuses a wrong mix before it starts one.
"""

from __future__ import annotations

from dataclasses import dataclass

from poisonq.errors import InvalidOptionError


@dataclass(frozen=True)
class Words:
    """How a surface names the two kinds and their options."""

    frame: str  # a DataFrame transform
    per_row: str  # a per-row function
    goes_with: str  # a per-row function, as what an option goes with
    schema: str
    expectations: str
    ignore_extra_fields: str
    isolate: str


PYTHON = Words(
    frame="transform=",
    per_row="map=",
    goes_with="map= (a function of one message)",
    schema="schema=",
    expectations="expectations=",
    ignore_extra_fields="ignore_extra_fields=",
    isolate="isolate=",
)
COMMAND_LINE = Words(
    frame="a DataFrame transform",
    per_row="a per-row function",
    goes_with="--schema (a function of one message)",
    schema="--schema",
    expectations="--expect",
    ignore_extra_fields="--ignore-extra-fields",
    isolate="--isolate/--no-isolate",
)


def check_options(
    words: Words,
    *,
    per_row: bool,
    schema: bool,
    expectations: bool,
    ignore_extra_fields: bool,
    isolate: bool,
) -> None:
    """Refuse, in one line, an option given to the kind of function it does not go with
    (each flag: whether the option was given)."""
    if per_row and expectations:
        raise InvalidOptionError(
            f"{words.expectations} checks the rows of {words.frame}; the rows of"
            f" {words.per_row} are checked against {words.schema} (raise PermanentError for"
            " anything else)"
        )
    if per_row and not schema:
        raise InvalidOptionError(f"{words.per_row} needs {words.schema}, its row's Spark schema")
    if per_row:
        return
    for option, given in (
        (words.schema, schema),
        (words.ignore_extra_fields, ignore_extra_fields),
        (words.isolate, isolate),
    ):
        if given:
            raise InvalidOptionError(
                f"{option} goes with {words.goes_with}; the output of {words.frame} is the"
                " DataFrame it returns"
            )
