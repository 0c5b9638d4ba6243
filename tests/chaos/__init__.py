"""The chaos suite: kill what runs at a random moment, run it again, and check that nothing was
lost or written twice.

Each scenario (``scenarios.py``) starts a real program in a process group of its own (a
producer, a ``Processor``, ``poisonq pipeline run``, a Structured Streaming query), sends it
``SIGKILL`` at a moment drawn from a seeded generator, runs it again to the end, and hands
what the queue and the output hold to one check (``verdict.py``): every good message in the
output exactly once (by ``message_id``), every bad one in the dead-letter queue exactly once
with its reason, nothing left held, the audit balanced, and no message handled by two holders
of valid locks. ``python -m tests.chaos`` runs each scenario many times and prints a table
(``make chaos``); ``tests/test_chaos.py`` runs each once in ``make test``.
"""
