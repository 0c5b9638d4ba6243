"""Sending to a topic and receiving from its subscription the SDK's asyncio way, through
``poisonq.servicebus.aio``.

Follows the flow of azure-sdk-for-python's samples/async_samples/send_topic_async.py and
receive_subscription_async.py, written anew in the SDK's idiom; only the import lines and the
connection string differ.
"""

import asyncio
import os

from poisonq.servicebus import ServiceBusMessage
from poisonq.servicebus.aio import ServiceBusClient

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
TOPIC_NAME = os.environ["SERVICEBUS_TOPIC_NAME"]
SUBSCRIPTION_NAME = os.environ["SERVICEBUS_SUBSCRIPTION_NAME"]


async def send_single_message(sender):
    await sender.send_messages(ServiceBusMessage("Single Message"))


async def send_a_list_of_messages(sender):
    await sender.send_messages([ServiceBusMessage("Message in list") for _ in range(10)])


async def send_batch_message(sender):
    batch_message = await sender.create_message_batch()
    for _ in range(10):
        try:
            batch_message.add_message(ServiceBusMessage("Message inside a ServiceBusMessageBatch"))
        except ValueError:
            break
    await sender.send_messages(batch_message)


async def main():
    servicebus_client = ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR)
    async with servicebus_client:
        sender = servicebus_client.get_topic_sender(topic_name=TOPIC_NAME)
        async with sender:
            await send_single_message(sender)
            await send_a_list_of_messages(sender)
            await send_batch_message(sender)

        receiver = servicebus_client.get_subscription_receiver(
            topic_name=TOPIC_NAME, subscription_name=SUBSCRIPTION_NAME
        )
        async with receiver:
            received_msgs = await receiver.receive_messages(max_message_count=100, max_wait_time=1)
            for msg in received_msgs:
                print(str(msg))
                await receiver.complete_message(msg)


asyncio.run(main())
print("Receive is done.")
