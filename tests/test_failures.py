"""Failure records and fingerprints group failures the way ServiceControl does."""

from __future__ import annotations

from poisonq import Broker, Message
from poisonq.failures import describe, failure_from_exception, fingerprint, root_cause


def _lookup(customer: str) -> None:
    raise KeyError(customer)


def _parse(customer: str) -> None:
    try:
        _lookup(customer)
    except KeyError as exc:
        raise RuntimeError("order failed") from exc


def _other_place(customer: str) -> None:
    raise KeyError(customer)


def _caught(func, *args):  # type: ignore[no-untyped-def]
    try:
        func(*args)
    except Exception as exc:
        return exc
    raise AssertionError("expected an exception")


def test_same_type_and_frame_with_other_text_share_a_fingerprint() -> None:
    assert fingerprint(_caught(_lookup, "cust-17")) == fingerprint(_caught(_lookup, "cust-42"))


def test_another_raising_frame_is_another_group() -> None:
    assert fingerprint(_caught(_lookup, "cust-17")) != fingerprint(_caught(_other_place, "cust-17"))


def test_the_root_cause_not_the_wrapper_decides() -> None:
    wrapped = _caught(_parse, "cust-17")
    assert isinstance(root_cause(wrapped), KeyError)
    assert fingerprint(wrapped) == fingerprint(_caught(_lookup, "cust-99"))
    record = failure_from_exception(wrapped, now=10.0)
    assert record.error_type == "KeyError"
    assert record.message == "'cust-17' → RuntimeError: order failed"
    assert "RuntimeError: order failed" in record.traceback
    assert "KeyError: 'cust-17'" in record.traceback
    assert describe(record) == "KeyError: 'cust-17' → RuntimeError: order failed"


def test_user_exception_types_are_qualified() -> None:
    class OrderError(Exception):
        pass

    record = failure_from_exception(_caught(lambda: (_ for _ in ()).throw(OrderError("x"))), 1.0)
    assert record.error_type.endswith("OrderError")
    assert record.error_type.startswith("tests.test_failures.")


def test_an_exception_text_no_store_can_keep_is_recorded_spelled_out(broker: Broker) -> None:
    """A NUL (PostgreSQL has none in text) or a lone surrogate (a file name that was not
    UTF-8) in an exception's text made recording the failure fail, so the abandon did too."""
    broker.create_queue("orders")
    (seq,) = broker.sender("orders").send(Message(body=b"x"))
    receiver = broker.receiver("orders")
    receiver.abandon(receiver.receive(), error=ValueError("cust\x00\udcff"))
    (failure,) = broker.message("orders", seq).failures
    assert failure.message == "cust\\x00\\udcff"
    assert "ValueError: cust\\x00\\udcff" in failure.traceback


def _rewrapped(customer: str, text: str) -> None:
    try:
        _lookup(customer)
    except KeyError as exc:
        raise RuntimeError(text.format(exc)) from exc


def test_the_root_causes_text_is_told_once_when_the_raised_exception_repeats_it() -> None:
    """An exception raised with the root cause's text (``raise X(str(error)) from error``)
    is told by its type alone, and one that quotes it has an ellipsis in its place."""
    repeated = failure_from_exception(_caught(_rewrapped, "cust-17", "{}"), now=1.0)
    assert repeated.message == "'cust-17' → RuntimeError"
    quoted = failure_from_exception(_caught(_rewrapped, "cust-17", "no customer {}!"), now=1.0)
    assert quoted.message == "'cust-17' → RuntimeError: no customer …!"
