"""Queue semantics: the message state machine of docs/design.md on top of any store.

Every public method runs exactly one store transaction, so every transition is atomic. The
engine decides *which* guarded transition to run (the retry policy's decision, TTL handling,
dead-letter targets, forwarding, sessions); the store runs it and keeps the ledger. Time is
the store's clock: an entity's housekeeping (expired locks, messages back from the retry
subqueue, due scheduled messages, expired TTLs) runs at the start of each receive on that
entity, inside the same transaction, so no message is ever delivered with an expired TTL and
an expired lock always counts as an abandon before the message can be received again; and
before every read of the entity (:mod:`~poisonq.engine.housekeeping`), so every reader sees
each transition when it is due.

The engine's operations are grouped by concept, one module each, all on the same store and
clock (:mod:`~poisonq.engine.base`): :mod:`~poisonq.engine.admin` (entities, status, the
way out of a fault), :mod:`~poisonq.engine.sending`, :mod:`~poisonq.engine.settling`,
:mod:`~poisonq.engine.receiving` (a receive may settle the last batch first),
:mod:`~poisonq.engine.sessions`, :mod:`~poisonq.engine.leases` (with
:mod:`~poisonq.engine.timeline`, the batches a pipeline records as it completes its leases),
:mod:`~poisonq.engine.tasks` and :mod:`~poisonq.engine.history` (the charts' reads). Inside
an operation's transaction they share three collaborators, each with a narrow interface and
testable alone:

- :class:`~poisonq.engine.resolving.Resolver`: an address to its entity and options; what an
  operation reads or checks of it (receivable, counts, report);
- :class:`~poisonq.engine.routing.Router`: dead-lettering, auto-forwarding, the namespace
  dead-letter queue;
- :class:`~poisonq.engine.poison.Poisoner`: the retry policy's decision after a failed
  delivery, the poison actions, auto-disable, housekeeping.
"""

from __future__ import annotations

from poisonq.engine.admin import Admin
from poisonq.engine.history import History
from poisonq.engine.leases import Leasing
from poisonq.engine.sending import Sending
from poisonq.engine.sessions import Sessions
from poisonq.engine.targets import Lock, Target
from poisonq.engine.tasks import Tasks


class Engine(Admin, Sending, Sessions, Leasing, Tasks, History):
    """The state machine. Thread-safe as far as the store is (each call is one transaction)."""


__all__ = ["Engine", "Lock", "Target"]
