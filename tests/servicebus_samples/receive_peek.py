"""Peeking: messages are browsed without a lock or a delivery counted.

Follows the flow of azure-sdk-for-python's samples/sync_samples/receive_peek.py, written
anew in the SDK's idiom; only the import line and the connection string differ.
"""

import os

from poisonq.servicebus import ServiceBusClient

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
QUEUE_NAME = os.environ["SERVICEBUS_QUEUE_NAME"]

servicebus_client = ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR)
with servicebus_client:
    receiver = servicebus_client.get_queue_receiver(queue_name=QUEUE_NAME)
    with receiver:
        received_msgs = receiver.peek_messages(max_message_count=2)
        for msg in received_msgs:
            print(str(msg))
        more = receiver.peek_messages(
            max_message_count=100, sequence_number=received_msgs[-1].sequence_number + 1
        )
        print(f"{len(more)} more after them")
print("Peek is done.")
