"""How much of a text the project keeps or shows, and the largest count it keeps, in one place.

Failure records, dead-letter descriptions and the values quoted in an error message are cut
to these lengths wherever they are made (the engine, the Processor, the Spark workers), so
every path keeps the same amount and a store never grows with a runaway exception text.
"""

from __future__ import annotations

from poisonq.errors import InvalidOptionError

MAX_INT = 2**63 - 1
"""The largest count or number the stores keep (a 64-bit integer)."""

MAX_ID_LENGTH = 128
"""Characters of a message id or a session id."""

MAX_OPERATOR = 60
"""Characters of an operator's name: who started or cancelled a task."""

MAX_MESSAGE = 4_096
"""Characters of an error's message in a failure record, and of a dead-letter description."""

MAX_TRACEBACK = 16_384
"""Characters of a failure record's traceback (its end: where the error was raised)."""

MAX_SHOWN_VALUE = 200
"""Characters of one value quoted in an error message (an output field that does not fit)."""

MAX_SHOWN_ROW = 2_000
"""Characters of a whole row quoted in a failure (a transform's output that does not fit)."""

MAX_SHOWN_VALUES = 400
"""Characters of a failing row's values in an expectation's dead-letter description."""

FORM_BYTES = 64 * 1024
"""Bytes of a request's body to the server, but for an API send: forms, login, filters."""

SEND_BYTES = 8 * 1024 * 1024
"""Bytes of an API send's body (a batch of messages in JSON), unless the server says more."""

READ_TIMEOUT = 15.0
"""Seconds the server waits for a request's headers, and then for its body."""


def tail(text: str, limit: int) -> str:
    """The end of ``text``, at most ``limit`` characters after a ``...`` line when cut: a
    traceback's last frames say where the error was raised."""
    return text if len(text) <= limit else "...\n" + text[-limit:]


def check_count(value: object, what: str, minimum: int = 1) -> None:
    """A count a caller gives (a batch size, a retry count, a size limit): an ``int``, not a
    ``bool``, from ``minimum`` to what the stores keep."""
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= MAX_INT:
        raise InvalidOptionError(
            f"{what} must be an integer from {minimum} to 2**63-1, not {value!r}"
        )
