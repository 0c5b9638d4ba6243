"""Sending to a queue: one message, a list, and a size-checked batch.

Follows the flow of azure-sdk-for-python's sdk/servicebus/azure-servicebus/samples/
sync_samples/send_queue.py, written anew in the SDK's idiom; only the import line and the
connection string (poisonq's store URL, in SERVICEBUS_CONNECTION_STR) differ from the SDK's.
"""

import os

from poisonq.servicebus import ServiceBusClient, ServiceBusMessage

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
QUEUE_NAME = os.environ["SERVICEBUS_QUEUE_NAME"]


def send_single_message(sender):
    sender.send_messages(ServiceBusMessage("Single Message"))


def send_a_list_of_messages(sender):
    sender.send_messages([ServiceBusMessage("Message in list") for _ in range(10)])


def send_batch_message(sender):
    batch_message = sender.create_message_batch()
    for _ in range(10):
        try:
            batch_message.add_message(ServiceBusMessage("Message inside a ServiceBusMessageBatch"))
        except ValueError:
            break  # the batch is full: send it, and start another for the rest
    sender.send_messages(batch_message)


servicebus_client = ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR)
with servicebus_client:
    sender = servicebus_client.get_queue_sender(queue_name=QUEUE_NAME)
    with sender:
        send_single_message(sender)
        send_a_list_of_messages(sender)
        send_batch_message(sender)
print("Send message is done.")
