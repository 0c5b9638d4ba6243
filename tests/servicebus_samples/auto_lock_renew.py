"""AutoLockRenewer: renewing the locks of received messages, and of a session, while they
are worked on; a renewal failure reported to a callback.

Follows the flow of azure-sdk-for-python's samples/sync_samples/auto_lock_renew.py, written
anew in the SDK's idiom; only the import lines and the connection string differ, and the
sample's long sleeps are left out (the tests of the renewal move a clock instead).
"""

import os

from poisonq.servicebus import AutoLockRenewer, ServiceBusClient, ServiceBusMessage

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
QUEUE_NAME = os.environ["SERVICEBUS_QUEUE_NAME"]
SESSION_QUEUE_NAME = os.environ["SERVICEBUS_SESSION_QUEUE_NAME"]


def renew_lock_on_message_received_from_non_sessionful_entity():
    with ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR) as client:
        with client.get_queue_sender(queue_name=QUEUE_NAME) as sender:
            sender.send_messages([ServiceBusMessage(f"message: {i}") for i in range(10)])

        renewer = AutoLockRenewer()
        with client.get_queue_receiver(queue_name=QUEUE_NAME, prefetch_count=10) as receiver:
            received_msgs = receiver.receive_messages(max_message_count=10, max_wait_time=1)
            for msg in received_msgs:
                renewer.register(receiver, msg, max_lock_renewal_duration=100)
            for msg in received_msgs:
                receiver.complete_message(msg)  # settling deregisters it from the renewer
        renewer.close()


def renew_lock_on_session_of_the_sessionful_entity():
    with ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR) as client:
        with client.get_queue_sender(queue_name=SESSION_QUEUE_NAME) as sender:
            messages = [ServiceBusMessage(f"message: {i}", session_id="SESSION") for i in range(10)]
            sender.send_messages(messages)

        renewer = AutoLockRenewer()
        with client.get_queue_receiver(
            queue_name=SESSION_QUEUE_NAME, session_id="SESSION", prefetch_count=10
        ) as receiver:
            renewer.register(receiver, receiver.session, max_lock_renewal_duration=100)
            received_msgs = receiver.receive_messages(max_message_count=10, max_wait_time=1)
            for msg in received_msgs:
                receiver.complete_message(msg)
        renewer.close()


def renew_lock_with_auto_lock_renewer_on_the_receiver():
    with ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR) as client:
        with client.get_queue_sender(queue_name=QUEUE_NAME) as sender:
            sender.send_messages(ServiceBusMessage("message"))

        def on_lock_renew_failure_callback(renewable, error):
            print(f"Failed to renew lock on {renewable} due to {error}")

        renewer = AutoLockRenewer(on_lock_renew_failure=on_lock_renew_failure_callback)
        with renewer, client.get_queue_receiver(QUEUE_NAME, auto_lock_renewer=renewer) as receiver:
            for msg in receiver.receive_messages(max_message_count=1, max_wait_time=1):
                receiver.complete_message(msg)


renew_lock_on_message_received_from_non_sessionful_entity()
renew_lock_on_session_of_the_sessionful_entity()
renew_lock_with_auto_lock_renewer_on_the_receiver()
