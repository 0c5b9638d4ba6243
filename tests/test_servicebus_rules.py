"""poisonq.servicebus' rules: how the SDK's calls, modes and errors map onto poisonq, on both
stores, on a clock the tests move (``ServiceBusClient.from_broker``)."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest

import poisonq
from poisonq import Broker, ManualClock
from poisonq.servicebus import (
    NEXT_AVAILABLE_SESSION,
    AutoLockRenewer,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from poisonq.servicebus import exceptions as sb
from tests.helpers import assert_balanced

WAIT = 0.05  # seconds a receive waits for a message that is there already


@pytest.fixture
def client(broker: Broker) -> Iterator[ServiceBusClient]:
    broker.create_queue("orders", max_delivery_count=2, lock_duration=30)
    broker.create_queue("sessions", requires_session=True, lock_duration=30)
    with ServiceBusClient.from_broker(broker) as opened:
        yield opened


def send(client: ServiceBusClient, queue: str, *bodies: str, **fields: Any) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(body, **fields) for body in bodies])


def test_peek_lock_counts_prior_deliveries_and_abandon_redelivers_until_dead_lettered(
    client: ServiceBusClient, broker: Broker
) -> None:
    """PEEK_LOCK: ``delivery_count`` is the SDK's (the deliveries before this one), an
    abandon counts one, and the queue's ``max_delivery_count`` dead-letters the message."""
    send(client, "orders", "a")
    with client.get_queue_receiver("orders", max_wait_time=WAIT) as receiver:
        (first,) = receiver.receive_messages()
        assert (first.delivery_count, first.raw.delivery_count) == (0, 1)
        receiver.abandon_message(first)
        (second,) = receiver.receive_messages()
        assert second.delivery_count == 1
        receiver.abandon_message(second)
        assert receiver.receive_messages() == []
    (dead,) = broker.dead_letters("orders")
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert_balanced(broker)


def test_receive_and_delete_removes_at_receipt_and_refuses_settlement(
    client: ServiceBusClient, broker: Broker
) -> None:
    send(client, "orders", "a")
    mode = ServiceBusReceiveMode.RECEIVE_AND_DELETE
    with client.get_queue_receiver("orders", receive_mode=mode, max_wait_time=WAIT) as receiver:
        (message,) = receiver.receive_messages()
        with pytest.raises(ValueError, match="RECEIVE_AND_DELETE"):
            receiver.complete_message(message)
    assert broker.counts("orders")["completed"] == 1
    assert_balanced(broker)


def test_a_message_is_settled_once_and_a_peeked_one_never(client: ServiceBusClient) -> None:
    send(client, "orders", "a", "b")
    with client.get_queue_receiver("orders", max_wait_time=WAIT) as receiver:
        peeked = receiver.peek_messages(2)
        with pytest.raises(ValueError, match="peeked"):
            receiver.complete_message(peeked[0])
        (message, other) = receiver.receive_messages(max_message_count=2)
        receiver.complete_message(message)
        with pytest.raises(sb.MessageAlreadySettled):
            receiver.dead_letter_message(message)
        receiver.defer_message(other)
        with pytest.raises(sb.MessageAlreadySettled):
            receiver.complete_message(other)


def test_a_message_settled_through_either_api_is_refused_by_the_other(
    client: ServiceBusClient, broker: Broker
) -> None:
    """One mark says a message is settled, the native message's: settled through the SDK's
    API, the native one refuses it (MessageAlreadySettledError), and settled natively, the
    SDK's refuses it (MessageAlreadySettled, which stands for poisonq's error where it is
    translated); neither reaches the store."""
    send(client, "orders", "a", "b")
    native = broker.receiver("orders")
    with client.get_queue_receiver("orders", max_wait_time=WAIT) as receiver:
        first, second = receiver.receive_messages(max_message_count=2)
        receiver.complete_message(first)
        with pytest.raises(poisonq.MessageAlreadySettledError):
            native.complete(first.raw)
        native.abandon(second.raw)
        with pytest.raises(sb.MessageAlreadySettled):
            receiver.complete_message(second)
    error = poisonq.MessageAlreadySettledError([second.sequence_number])
    translated = sb.translate(error)
    assert isinstance(translated, sb.MessageAlreadySettled) and translated.error is error
    assert broker.counts("orders")["completed"] == 1
    assert_balanced(broker)


def test_a_lost_lock_raises_message_lock_lost_error_and_changes_nothing(
    client: ServiceBusClient, broker: Broker, clock: ManualClock
) -> None:
    send(client, "orders", "a")
    with client.get_queue_receiver("orders", max_wait_time=WAIT) as receiver:
        (message,) = receiver.receive_messages()
        clock.advance(31)
        with pytest.raises(sb.MessageLockLostError) as caught:
            receiver.complete_message(message)
    assert isinstance(caught.value.error, poisonq.MessageLockLostError)
    assert caught.value.__cause__ is caught.value.error
    assert broker.counts("orders")["completed"] == 0
    assert_balanced(broker)


def test_the_dead_letter_subqueue_is_read_by_sub_queue_in_any_spelling(
    client: ServiceBusClient, broker: Broker
) -> None:
    send(client, "orders", "a")
    with client.get_queue_receiver("orders", max_wait_time=WAIT) as receiver:
        (message,) = receiver.receive_messages()
        receiver.dead_letter_message(message, reason="Bad", error_description="why")
    for spelling in (ServiceBusSubQueue.DEAD_LETTER, "deadletter", "DEAD_LETTER"):
        dlq = client.get_queue_receiver("orders", sub_queue=spelling, max_wait_time=WAIT)
        (dead,) = dlq.peek_messages()
        assert (dead.dead_letter_reason, dead.dead_letter_error_description) == ("Bad", "why")
    with pytest.raises(ValueError, match="sub_queue"):
        client.get_queue_receiver("orders", sub_queue="poison")
    assert_balanced(broker)


def test_next_available_session_takes_a_free_one_or_times_out(
    client: ServiceBusClient, broker: Broker
) -> None:
    """NEXT_AVAILABLE_SESSION accepts a session nobody holds; with none,
    OperationTimeoutError after ``max_wait_time``. A named session another receiver holds
    raises SessionCannotBeLockedError."""
    send(client, "sessions", "a1", "a2", session_id="a")
    holder = client.get_queue_receiver(
        "sessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=WAIT
    )
    with holder:
        assert holder.session.session_id == "a"
        with pytest.raises(sb.SessionCannotBeLockedError):
            client.get_queue_receiver("sessions", session_id="a").__enter__()
        with pytest.raises(sb.OperationTimeoutError):
            client.get_queue_receiver(
                "sessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=WAIT
            ).__enter__()
        with pytest.raises(TypeError, match="session lock"):
            holder.renew_message_lock(holder.receive_messages()[0])
    assert broker.counts("sessions")["active"] == 2  # the close gave the session back
    assert_balanced(broker)


def test_closing_the_client_gives_back_the_sessions_its_receivers_hold(
    broker: Broker,
) -> None:
    """As the SDK's client shuts its handlers down: a session still held goes back with its
    messages when the client closes, no delivery counted."""
    broker.create_queue("sessions", requires_session=True)
    with ServiceBusClient.from_broker(broker) as client:
        send(client, "sessions", "a1", session_id="a")
        receiver = client.get_queue_receiver("sessions", session_id="a", max_wait_time=WAIT)
        receiver.__enter__()
        assert len(receiver.receive_messages()) == 1
    with broker.accept_session("sessions", "a") as session:
        (message,) = session.receive()
        assert message.delivery_count == 1
        session.complete(message)
    assert_balanced(broker)


def test_sessions_are_listed_by_their_ids(client: ServiceBusClient) -> None:
    send(client, "sessions", "a1", session_id="a")
    send(client, "sessions", "b1", session_id="b")
    assert list(client.list_queue_sessions("sessions")) == ["a", "b"]
    with pytest.raises(sb.ServiceBusError):
        list(client.list_queue_sessions("orders"))  # no sessions there


def test_a_session_lock_that_ran_out_raises_session_lock_lost_error(
    client: ServiceBusClient, clock: ManualClock
) -> None:
    send(client, "sessions", "a1", session_id="a")
    with client.get_queue_receiver("sessions", session_id="a", max_wait_time=WAIT) as receiver:
        clock.advance(31)
        with pytest.raises(sb.SessionLockLostError):
            receiver.session.renew_lock()


def test_a_batch_refuses_the_message_past_its_size_and_stays_as_it_was(
    client: ServiceBusClient, broker: Broker
) -> None:
    with client.get_queue_sender("orders") as sender:
        batch = sender.create_message_batch(max_size_in_bytes=25)
        batch.add_message(ServiceBusMessage("0123456789"))
        batch.add_message(ServiceBusMessage("0123456789"))
        with pytest.raises(sb.MessageSizeExceededError) as caught:
            batch.add_message(ServiceBusMessage("0123456789"))
        assert isinstance(caught.value, ValueError)
        assert (len(batch), batch.size_in_bytes) == (2, 20)
        sender.send_messages(batch)
        limit = broker.get_queue("orders").options.max_message_size
        assert sender.create_message_batch().max_size_in_bytes == limit
        with pytest.raises(ValueError, match="max_message_size"):
            sender.create_message_batch(max_size_in_bytes=limit + 1)
        with pytest.raises(sb.MessageSizeExceededError):
            sender.send_messages(ServiceBusMessage(b"x" * (limit + 1)))
    assert broker.counts("orders")["active"] == 2
    assert_balanced(broker)


def test_poisonq_errors_become_the_sdks_exception_types(client: ServiceBusClient) -> None:
    with pytest.raises(sb.MessagingEntityNotFoundError):
        send(client, "nowhere", "a")
    with client.get_queue_sender("orders") as sender, pytest.raises(sb.MessageNotFoundError):
        sender.cancel_scheduled_messages(12345)
    receiver = client.get_queue_receiver("orders", max_wait_time=WAIT)
    with pytest.raises(sb.MessageNotFoundError):
        receiver.receive_deferred_messages([12345])
    client.broker().disable("orders")
    with pytest.raises(sb.MessagingEntityDisabledError):
        send(client, "orders", "a")


def test_received_messages_read_as_the_sdks(client: ServiceBusClient, clock: ManualClock) -> None:
    """Application properties come back with bytes keys and bytes text values, the body as
    an iterator over its one section, the state and time to live as the SDK gives them."""
    send(
        client,
        "orders",
        "héllo",
        application_properties={"region": "eu", b"n": 7},
        subject="order",
        time_to_live=datetime.timedelta(minutes=5),
        to="billing",
        reply_to_session_id="r-1",
        partition_key="p-1",
    )
    with client.get_queue_receiver("orders", max_wait_time=WAIT) as receiver:
        (message,) = receiver.receive_messages()
        assert message.application_properties == {b"region": b"eu", b"n": 7}
        assert b"".join(message.body) == "héllo".encode() and str(message) == "héllo"
        assert message.time_to_live == datetime.timedelta(minutes=5)
        assert message.state is ServiceBusMessageState.ACTIVE and message.subject == "order"
        assert (message.to, message.reply_to_session_id, message.partition_key) == (
            "billing",
            "r-1",
            "p-1",
        )
        receiver.defer_message(message)
        (deferred,) = receiver.peek_messages()
        assert deferred.state is ServiceBusMessageState.DEFERRED
    with client.get_queue_sender("orders") as sender:
        sender.send_messages(deferred)  # sent again as a new message, with its fields
    with client.get_queue_receiver("orders", max_wait_time=WAIT) as receiver:
        (copy,) = receiver.receive_messages()
        assert (str(copy), copy.to, copy.application_properties) == (
            "héllo",
            "billing",
            {b"region": b"eu", b"n": 7},
        )


def test_what_poisonq_cannot_mean_is_refused_by_name(client: ServiceBusClient) -> None:
    """Credentials, Service Bus connection strings, proxies and AMQP annotated messages
    raise FeatureNotSupportedError naming the feature."""
    cases = [
        lambda: ServiceBusClient("ns.servicebus.windows.net", credential=object()),
        lambda: ServiceBusClient.from_connection_string(
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=s"
        ),
        lambda: ServiceBusClient.from_connection_string(
            "sqlite:///q.db", http_proxy={"proxy_hostname": "p", "proxy_port": 3128}
        ),
        lambda: ServiceBusMessage("a", raw_amqp_message=object()),
    ]
    features = []
    for case in cases:
        with pytest.raises(sb.FeatureNotSupportedError) as caught:
            case()
        features.append(caught.value.feature)
    assert features == [
        "credentials",
        "Service Bus connection strings",
        "proxies",
        "AMQP annotated messages",
    ]


def test_the_renewer_keeps_a_received_messages_lock_until_it_is_settled(
    client: ServiceBusClient, broker: Broker, clock: ManualClock
) -> None:
    send(client, "orders", "a")
    renewer = AutoLockRenewer(check_interval=3600)  # its passes are this test's
    with (
        renewer,
        client.get_queue_receiver(
            "orders", auto_lock_renewer=renewer, max_wait_time=WAIT
        ) as receiver,
    ):
        (message,) = receiver.receive_messages()
        for _ in range(3):  # three times the lock's duration
            clock.advance(20)
            renewer.renew_due()
        receiver.complete_message(message)
    assert broker.counts("orders")["completed"] == 1
    assert_balanced(broker)


def test_a_lock_lost_under_the_renewer_is_reported_with_the_sdks_objects(
    client: ServiceBusClient, clock: ManualClock
) -> None:
    send(client, "orders", "a")
    lost: list[tuple[object, BaseException | None]] = []
    renewer = AutoLockRenewer(
        max_lock_renewal_duration=0,
        on_lock_renew_failure=lambda what, error: lost.append((what, error)),
        check_interval=3600,
    )
    with renewer, client.get_queue_receiver("orders", max_wait_time=WAIT) as receiver:
        (message,) = receiver.receive_messages()
        renewer.register(receiver, message)
        clock.advance(31)
        renewer.renew_due()
    [(what, error)] = lost
    assert what is message
    assert isinstance(error, sb.AutoLockRenewFailed)
    assert isinstance(error.error, sb.MessageLockLostError)
    assert message.auto_renew_error is error


def test_a_message_is_settled_only_through_a_receiver_of_the_entity_it_came_from(
    client: ServiceBusClient, broker: Broker
) -> None:
    """A receiver of another entity refuses to settle it with a ValueError naming both, and
    changes nothing (the store would find no such lock there: not a lost lock); a receiver
    of the same queue settles it."""
    broker.create_queue("other")
    send(client, "orders", "a")
    with client.get_queue_receiver("orders", max_wait_time=WAIT) as receiver:
        (message,) = receiver.receive_messages()
    with (
        client.get_queue_receiver("other") as other,
        pytest.raises(ValueError, match=r"received from 'orders'.* not of 'other'"),
    ):
        other.complete_message(message)
    assert broker.counts("orders")["locked"] == 1
    with client.get_queue_receiver("orders") as same_queue:
        same_queue.complete_message(message)
    assert broker.counts("orders")["completed"] == 1
    assert_balanced(broker)


def test_a_session_queue_refuses_a_send_with_a_message_without_a_session_id(
    client: ServiceBusClient, broker: Broker
) -> None:
    """As Service Bus refuses it (ServiceBusError, nothing of the send taken), where
    poisonq's own sender dead-letters it as SessionIdIsNull; scheduling too."""
    with client.get_queue_sender("sessions") as sender:
        for send_it in (
            lambda: sender.send_messages(
                [ServiceBusMessage("a", session_id="s"), ServiceBusMessage("b")]
            ),
            lambda: sender.schedule_messages(ServiceBusMessage("b"), datetime.datetime.now()),
        ):
            with pytest.raises(sb.ServiceBusError, match="SessionId was not set"):
                send_it()
        sender.send_messages(ServiceBusMessage("a", session_id="s"))
    counts = broker.counts("sessions")
    assert (counts["active"], counts["scheduled"], counts["dead_lettered"]) == (1, 0, 0)
    assert_balanced(broker)
