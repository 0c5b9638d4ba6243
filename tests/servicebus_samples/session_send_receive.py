"""Sending to a session queue and receiving one session, with its state and lock.

Follows the flow of azure-sdk-for-python's samples/sync_samples/session_send_receive.py,
written anew in the SDK's idiom; only the import line and the connection string differ.
"""

import os

from poisonq.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
SESSION_QUEUE_NAME = os.environ["SERVICEBUS_SESSION_QUEUE_NAME"]
SESSION_ID = os.environ["SERVICEBUS_SESSION_ID"]


def send_single_message(sender):
    sender.send_messages(ServiceBusMessage("Single session message", session_id=SESSION_ID))


def send_a_list_of_messages(sender):
    messages = [ServiceBusMessage("Session Message in list", session_id=SESSION_ID)] * 10
    sender.send_messages(messages)


def send_batch_message(sender):
    batch_message = sender.create_message_batch()
    for _ in range(10):
        try:
            batch_message.add_message(
                ServiceBusMessage("Session Message inside a batch", session_id=SESSION_ID)
            )
        except ValueError:
            break
    sender.send_messages(batch_message)


def receive_batch_message(receiver):
    session = receiver.session
    session.set_state("START")
    print("Session state:", session.get_state())
    received_msgs = receiver.receive_messages(max_message_count=30, max_wait_time=1)
    for msg in received_msgs:
        print(str(msg))
        receiver.complete_message(msg)
        session.renew_lock()
    session.set_state("END")
    print("Session state:", session.get_state())


servicebus_client = ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR)
with servicebus_client:
    sender = servicebus_client.get_queue_sender(queue_name=SESSION_QUEUE_NAME)
    with sender:
        send_single_message(sender)
        send_a_list_of_messages(sender)
        send_batch_message(sender)

    receiver = servicebus_client.get_queue_receiver(
        queue_name=SESSION_QUEUE_NAME, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
    )
    with receiver:
        receive_batch_message(receiver)
print("Receive is done.")
