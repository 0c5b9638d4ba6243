"""Scheduling messages on a queue and cancelling them before they are due.

Follows the flow of azure-sdk-for-python's samples/sync_samples/
schedule_messages_and_cancellation.py (and, with SERVICEBUS_TOPIC_NAME set in place of the
queue, schedule_topic_messages_and_cancellation.py), written anew in the SDK's idiom; only
the import line and the connection string differ.
"""

import datetime
import os

from poisonq.servicebus import ServiceBusClient, ServiceBusMessage

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
TOPIC_NAME = os.environ.get("SERVICEBUS_TOPIC_NAME")
QUEUE_NAME = os.environ.get("SERVICEBUS_QUEUE_NAME")


def schedule_single_message(sender):
    message = ServiceBusMessage("Message to be scheduled")
    scheduled_time_utc = datetime.datetime.utcnow() + datetime.timedelta(seconds=30)
    return sender.schedule_messages(message, scheduled_time_utc)


def schedule_multiple_messages(sender):
    messages_to_schedule = [ServiceBusMessage("Message to be scheduled") for _ in range(10)]
    scheduled_time_utc = datetime.datetime.utcnow() + datetime.timedelta(seconds=30)
    return sender.schedule_messages(messages_to_schedule, scheduled_time_utc)


servicebus_client = ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR)
with servicebus_client:
    if TOPIC_NAME:
        sender = servicebus_client.get_topic_sender(topic_name=TOPIC_NAME)
    else:
        sender = servicebus_client.get_queue_sender(queue_name=QUEUE_NAME)
    with sender:
        sequence_number = schedule_single_message(sender)
        print(f"Single message is scheduled and sequence number is {sequence_number}")
        sequence_numbers = schedule_multiple_messages(sender)
        print(f"Multiple messages are scheduled and sequence numbers are {sequence_numbers}")

        sender.cancel_scheduled_messages(sequence_number)
        sender.cancel_scheduled_messages(sequence_numbers)
        print("All scheduled messages are cancelled.")
