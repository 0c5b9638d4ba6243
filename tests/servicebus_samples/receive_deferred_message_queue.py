"""Deferring messages, then receiving them again by sequence number.

Follows the flow of azure-sdk-for-python's samples/sync_samples/
receive_deferred_message_queue.py, written anew in the SDK's idiom; only the import line and
the connection string differ.
"""

import os

from poisonq.servicebus import ServiceBusClient, ServiceBusMessage

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
QUEUE_NAME = os.environ["SERVICEBUS_QUEUE_NAME"]

servicebus_client = ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR)
with servicebus_client:
    sender = servicebus_client.get_queue_sender(queue_name=QUEUE_NAME)
    with sender:
        sender.send_messages([ServiceBusMessage("Message to be deferred") for _ in range(10)])

    receiver = servicebus_client.get_queue_receiver(queue_name=QUEUE_NAME, max_wait_time=1)
    with receiver:
        deferred_sequenced_numbers = []
        for msg in receiver.receive_messages(max_message_count=10):
            deferred_sequenced_numbers.append(msg.sequence_number)
            receiver.defer_message(msg)

        received_deferred_msg = receiver.receive_deferred_messages(
            sequence_numbers=deferred_sequenced_numbers
        )
        for msg in received_deferred_msg:
            print("Completing deferred msg:", msg.sequence_number)
            receiver.complete_message(msg)
print("Receive is done.")
