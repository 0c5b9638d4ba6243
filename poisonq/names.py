"""Entity names and addresses.

A name is 1-260 letters, digits, ``.``, ``-``, ``_`` or ``/``, and no segment between
slashes is ``.`` or ``..``: a client that normalises paths (a browser, curl, a proxy) would
turn ``x/../admin`` into ``admin`` and act on another queue. A store made before this rule may
hold such a name: it is still found and listed (:func:`parse_address` takes it), and
``poisonq serve`` names it at start (:func:`dot_segments`). An *address* is a name plus an
optional subqueue, written the Service Bus way (``orders/$deadletterqueue``,
``orders/$transfer/$deadletterqueue``) or the MSMQ way (``orders;poison``, ``orders;retry``).
The ``$`` and ``;`` forms can never collide with a user name because users cannot write them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from poisonq.errors import InvalidNameError
from poisonq.model import SubQueue

NAMESPACE_DEADLETTER = "$deadletterqueue"
"""The namespace dead-letter queue: where ``reject`` sends a message whose ``reply_to`` names
no queue (MSMQ's system dead-letter queue)."""

_NAME = re.compile(r"[A-Za-z0-9._\-/]{1,260}")

# Longest first: the transfer dead-letter suffix ends like the dead-letter one.
_SUFFIXES: dict[str, SubQueue] = {
    "/$transfer/$deadletterqueue": SubQueue.TRANSFER_DEADLETTER,
    "/$deadletterqueue": SubQueue.DEADLETTER,
    ";poison": SubQueue.DEADLETTER,
    ";deadletter": SubQueue.DEADLETTER,
    ";retry": SubQueue.RETRY,
}


def validate_name(name: object) -> str:
    """Return ``name`` if it is a valid name for a new entity (or a consumer, or a forwarding
    target), else raise :class:`InvalidNameError`."""
    checked = _check_characters(name)
    if dot_segments(checked):
        raise InvalidNameError(checked, "no segment between '/' may be '.' or '..'")
    return checked


def dot_segments(name: str) -> bool:
    """Whether ``name`` has a ``.`` or ``..`` segment, which paths normalise away."""
    return any(segment in (".", "..") for segment in name.split("/"))


def _check_characters(name: object) -> str:
    """The characters and slashes of a name, the rule names had before ``.`` and ``..``
    segments were refused: what an existing entity's address is checked against."""
    if not isinstance(name, str):
        raise InvalidNameError(repr(name), "a name must be a string")
    if not _NAME.fullmatch(name):
        if not name:
            raise InvalidNameError(name, "a name cannot be empty")
        if len(name) > 260:
            raise InvalidNameError(name[:40] + "...", "a name has at most 260 characters")
        raise InvalidNameError(name, "use only letters, digits, '.', '-', '_' and '/'")
    if name.startswith("/") or name.endswith("/") or "//" in name:
        raise InvalidNameError(name, "'/' separates path segments; no empty segment")
    return name


@dataclass(frozen=True, slots=True)
class Address:
    """An entity and which of its subqueues (``None`` for the entity itself)."""

    entity: str
    subqueue: SubQueue | None = None

    def __str__(self) -> str:
        return subqueue_name(self.entity, self.subqueue)


def subqueue_name(entity: str, subqueue: SubQueue | None) -> str:
    """The canonical address of ``entity``'s ``subqueue``."""
    match subqueue:
        case None:
            return entity
        case SubQueue.DEADLETTER:
            return f"{entity}/$deadletterqueue"
        case SubQueue.RETRY:
            return f"{entity};retry"
        case SubQueue.TRANSFER_DEADLETTER:
            return f"{entity}/$transfer/$deadletterqueue"


def parse_address(address: str, subqueue: SubQueue | str | None = None) -> Address:
    """Split ``address`` into entity and subqueue; ``subqueue`` may name it separately."""
    if not isinstance(address, str):
        raise InvalidNameError(repr(address), "an address must be a string")
    if address == NAMESPACE_DEADLETTER and subqueue in (None, SubQueue.DEADLETTER):
        return Address(address)  # a dead-letter queue itself, with no subqueues
    found: SubQueue | None = None
    for suffix, kind in _SUFFIXES.items():
        if address.endswith(suffix):
            address, found = address[: -len(suffix)], kind
            break
    if subqueue is not None:
        try:
            wanted = SubQueue(subqueue)
        except ValueError:
            choices = ", ".join(s.value for s in SubQueue)
            raise InvalidNameError(
                str(subqueue), f"unknown subqueue; use one of {choices}"
            ) from None
        if found is not None and found != wanted:
            raise InvalidNameError(address, f"names subqueue {found} and {wanted} at once")
        found = wanted
    return Address(_check_characters(address), found)
