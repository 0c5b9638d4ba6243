"""The kinds of pipeline function and the options each takes: the rules stated once, for
``Pipeline`` and the command line, each naming the options in its own words.

A DataFrame transform (``transform=``) returns the output DataFrame, checked by
expectations; a function of messages (``map=``, one message; ``map_batches=``, an Arrow
batch of them) returns rows of ``schema=``, checked against it, and may drop extra fields or
run without the crash guard. Nothing here needs a Spark session, so the command line refuses
a wrong mix before it starts one.
"""

from __future__ import annotations

from dataclasses import dataclass

from poisonq.errors import InvalidOptionError


@dataclass(frozen=True)
class Words:
    """How a surface names the two kinds and their options."""

    frame: str  # a DataFrame transform
    goes_with: str  # a function of messages, as what an option goes with
    schema: str
    expectations: str
    ignore_extra_fields: str
    isolate: str


PYTHON = Words(
    frame="transform=",
    goes_with="map= or map_batches= (a function of messages)",
    schema="schema=",
    expectations="expectations=",
    ignore_extra_fields="ignore_extra_fields=",
    isolate="isolate=",
)
COMMAND_LINE = Words(
    frame="a DataFrame transform",
    goes_with="--schema (a function of one message)",
    schema="--schema",
    expectations="--expect",
    ignore_extra_fields="--ignore-extra-fields",
    isolate="--isolate/--no-isolate",
)


def check_options(
    words: Words,
    *,
    of_messages: str | None,
    schema: bool,
    expectations: bool,
    ignore_extra_fields: bool,
    isolate: bool,
) -> None:
    """Refuse, in one line, an option given to the kind of function it does not go with.
    ``of_messages`` names the function of messages given (None: a DataFrame transform); each
    flag says whether that option was given."""
    if of_messages and expectations:
        raise InvalidOptionError(
            f"{words.expectations} checks the rows of {words.frame}; the rows of"
            f" {of_messages} are checked against {words.schema} (raise PermanentError for"
            " anything else)"
        )
    if of_messages and not schema:
        raise InvalidOptionError(f"{of_messages} needs {words.schema}, its rows' Spark schema")
    if of_messages:
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
