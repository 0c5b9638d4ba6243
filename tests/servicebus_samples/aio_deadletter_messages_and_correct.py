"""deadletter_messages_and_correct.py the SDK's asyncio way: a message abandoned until the
queue dead-letters it; messages dead-lettered by the receiver, corrected from the
dead-letter queue and sent again. The client is closed by hand at the end, as the sample
does, not by ``async with``.

Follows the flow of azure-sdk-for-python's
samples/async_samples/deadletter_messages_and_correct_async.py, written anew in the SDK's
idiom; only the import lines and the connection string differ.
"""

import asyncio
import os

from poisonq.servicebus import ServiceBusMessage, ServiceBusSubQueue
from poisonq.servicebus.aio import ServiceBusClient

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
QUEUE_NAME = os.environ["SERVICEBUS_QUEUE_NAME"]


async def send_messages(servicebus_client, num_messages):
    sender = servicebus_client.get_queue_sender(queue_name=QUEUE_NAME)
    async with sender:
        msg = [
            ServiceBusMessage(
                f"Message to be deadlettered number: {i}",
                subject="Bad" if i % 2 == 0 else "Good",
            )
            for i in range(num_messages)
        ]
        await sender.send_messages(msg)


async def exceed_max_delivery(servicebus_client):
    receiver = servicebus_client.get_queue_receiver(queue_name=QUEUE_NAME)
    dlq_receiver = servicebus_client.get_queue_receiver(
        queue_name=QUEUE_NAME, sub_queue=ServiceBusSubQueue.DEAD_LETTER
    )
    async with receiver:
        received_msgs = await receiver.receive_messages(max_wait_time=1)
        while len(received_msgs) > 0:
            for msg in received_msgs:
                print(f"Message delivery_count: {msg.delivery_count}")
                await receiver.abandon_message(msg)
            received_msgs = await receiver.receive_messages(max_wait_time=1)

    async with dlq_receiver:
        received_msgs = await dlq_receiver.receive_messages(max_message_count=10, max_wait_time=1)
        for msg in received_msgs:
            print("Deadletter message:", msg.dead_letter_reason)
            await dlq_receiver.complete_message(msg)


async def receive_messages(servicebus_client):
    receiver = servicebus_client.get_queue_receiver(queue_name=QUEUE_NAME)
    async with receiver:
        received_msgs = await receiver.receive_messages(max_message_count=10, max_wait_time=1)
        for msg in received_msgs:
            if msg.subject and msg.subject == "Good":
                await receiver.complete_message(msg)
            else:
                await receiver.dead_letter_message(
                    msg,
                    reason="ProcessingError",
                    error_description="Don't know what to do with this message.",
                )


async def fix_deadletters(servicebus_client):
    sender = servicebus_client.get_queue_sender(queue_name=QUEUE_NAME)
    receiver = servicebus_client.get_queue_receiver(queue_name=QUEUE_NAME)
    dlq_receiver = servicebus_client.get_queue_receiver(
        queue_name=QUEUE_NAME, sub_queue=ServiceBusSubQueue.DEAD_LETTER
    )
    msgs_to_send = []
    async with dlq_receiver:
        received_dlq_msgs = await dlq_receiver.receive_messages(
            max_message_count=10, max_wait_time=1
        )
        for msg in received_dlq_msgs:
            if msg.subject and msg.subject == "Bad":
                msg_copy = ServiceBusMessage(str(msg), subject="Good")
                msgs_to_send.append(msg_copy)
                print(f"Fixing message: Body={next(msg.body)}, Subject={msg.subject}")
            await dlq_receiver.complete_message(msg)
    async with sender:
        await sender.send_messages(msgs_to_send)
    async with receiver:
        received_msgs = await receiver.receive_messages(max_message_count=10, max_wait_time=1)
        for msg in received_msgs:
            if msg.subject and msg.subject == "Good":
                print(f"Received fixed message: Body={next(msg.body)}, Subject={msg.subject}")
                await receiver.complete_message(msg)


async def main():
    servicebus_client = ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR)

    # Abandoned until the queue's max_delivery_count dead-letters it.
    await send_messages(servicebus_client, 1)
    await exceed_max_delivery(servicebus_client)

    # The Bad ones dead-lettered by the receiver, corrected and sent again.
    await send_messages(servicebus_client, 10)
    await receive_messages(servicebus_client)
    await fix_deadletters(servicebus_client)

    await servicebus_client.close()


asyncio.run(main())
