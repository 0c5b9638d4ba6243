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
from enum import StrEnum

from poisonq.errors import InvalidOptionError


class OfMessages(StrEnum):
    """The two kinds of function of messages."""

    MAP = "map"  # one message
    MAP_BATCHES = "map_batches"  # an Arrow batch of messages


# How each kind fails a message it rejects, which it does instead of expectations.
REJECTING = {
    OfMessages.MAP: "raise PermanentError for a message it rejects: it is dead-lettered",
    OfMessages.MAP_BATCHES: (
        "return (rows, errors), errors with an entry per message: a text for a message it"
        " rejects dead-letters it Rejected, None passes it"
    ),
}


@dataclass(frozen=True)
class Words:
    """How a surface names the kinds and their options."""

    frame: str  # a DataFrame transform
    of_messages: dict[OfMessages, str]  # each function of messages
    goes_with: str  # a function of messages, as what an option goes with
    schema: str
    expectations: str
    ignore_extra_fields: str
    isolate: str


PYTHON = Words(
    frame="transform=",
    of_messages={OfMessages.MAP: "map=", OfMessages.MAP_BATCHES: "map_batches="},
    goes_with="map= or map_batches= (a function of messages)",
    schema="schema=",
    expectations="expectations=",
    ignore_extra_fields="ignore_extra_fields=",
    isolate="isolate=",
)
COMMAND_LINE = Words(
    frame="a DataFrame transform",
    of_messages={
        OfMessages.MAP: "a per-row function",
        OfMessages.MAP_BATCHES: "a batch function (--batches)",
    },
    goes_with="--schema (a function of one message)",
    schema="--schema",
    expectations="--expect",
    ignore_extra_fields="--ignore-extra-fields",
    isolate="--isolate/--no-isolate",
)


def check_options(
    words: Words,
    *,
    of_messages: OfMessages | None,
    schema: bool,
    expectations: bool,
    ignore_extra_fields: bool,
    isolate: bool,
) -> None:
    """Refuse, in one line, an option given to the kind of function it does not go with.
    ``of_messages`` is the kind of function of messages given (None: a DataFrame
    transform); each flag says whether that option was given."""
    if of_messages is None:
        for option, given in (
            (words.schema, schema),
            (words.ignore_extra_fields, ignore_extra_fields),
            (words.isolate, isolate),
        ):
            if given:
                raise InvalidOptionError(
                    f"{option} goes with {words.goes_with}; the output of {words.frame} is"
                    " the DataFrame it returns"
                )
        return
    name = words.of_messages[of_messages]
    if expectations:
        raise InvalidOptionError(
            f"{words.expectations} checks the rows of {words.frame}; the rows of {name} are"
            f" checked against {words.schema}, and for anything else it can"
            f" {REJECTING[of_messages]}"
        )
    if not schema:
        raise InvalidOptionError(f"{name} needs {words.schema}, its rows' Spark schema")
