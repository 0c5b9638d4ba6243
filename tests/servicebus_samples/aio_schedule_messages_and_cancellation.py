"""schedule_messages_and_cancellation.py the SDK's asyncio way: scheduling one message and a
list, to a queue or (with SERVICEBUS_TOPIC_NAME) a topic, then cancelling them before they
are due, through ``poisonq.servicebus.aio``.

Follows the flow of azure-sdk-for-python's
samples/async_samples/schedule_messages_and_cancellation_async.py and
schedule_topic_messages_and_cancellation_async.py, written anew in the SDK's idiom; only the
import lines and the connection string differ.
"""

import asyncio
import datetime
import os

from poisonq.servicebus import ServiceBusMessage
from poisonq.servicebus.aio import ServiceBusClient

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
TOPIC_NAME = os.environ.get("SERVICEBUS_TOPIC_NAME")
QUEUE_NAME = os.environ.get("SERVICEBUS_QUEUE_NAME")


async def schedule_single_message(sender):
    message = ServiceBusMessage("ServiceBusMessage to be scheduled")
    scheduled_time_utc = datetime.datetime.utcnow() + datetime.timedelta(seconds=30)
    sequence_number = await sender.schedule_messages(message, scheduled_time_utc)
    return sequence_number


async def schedule_multiple_messages(sender):
    messages_to_schedule = []
    for _ in range(10):
        messages_to_schedule.append(ServiceBusMessage("Message to be scheduled"))

    scheduled_time_utc = datetime.datetime.utcnow() + datetime.timedelta(seconds=30)
    sequence_numbers = await sender.schedule_messages(messages_to_schedule, scheduled_time_utc)
    return sequence_numbers


async def main():
    servicebus_client = ServiceBusClient.from_connection_string(
        conn_str=CONNECTION_STR, logging_enable=True
    )
    async with servicebus_client:
        if TOPIC_NAME:
            sender = servicebus_client.get_topic_sender(topic_name=TOPIC_NAME)
        else:
            sender = servicebus_client.get_queue_sender(queue_name=QUEUE_NAME)
        async with sender:
            sequence_number = await schedule_single_message(sender)
            print(f"Single message is scheduled and sequence number is {sequence_number}")
            sequence_numbers = await schedule_multiple_messages(sender)
            print(f"Multiple messages are scheduled and sequence numbers are {sequence_numbers}")

            await sender.cancel_scheduled_messages(sequence_number)
            await sender.cancel_scheduled_messages(sequence_numbers)
            print("All scheduled messages are cancelled.")


asyncio.run(main())
