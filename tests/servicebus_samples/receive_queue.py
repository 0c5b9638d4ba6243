"""Receiving a batch from a queue and completing each message; then the rest one at a time
by iterating the receiver.

Follows the flow of azure-sdk-for-python's samples/sync_samples/receive_queue.py and
receive_iterator_queue.py, written anew in the SDK's idiom; only the import line and the
connection string (poisonq's store URL) differ from the SDK's.
"""

import os

from poisonq.servicebus import ServiceBusClient

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
QUEUE_NAME = os.environ["SERVICEBUS_QUEUE_NAME"]

servicebus_client = ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR)
with servicebus_client:
    receiver = servicebus_client.get_queue_receiver(queue_name=QUEUE_NAME, max_wait_time=1)
    with receiver:
        for msg in receiver.receive_messages(max_message_count=10):
            print(str(msg))
            receiver.complete_message(msg)
        for msg in receiver:  # ends once no message came for max_wait_time
            print(str(msg))
            receiver.complete_message(msg)
print("Receive is done.")
