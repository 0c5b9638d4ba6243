"""session_send_receive.py the SDK's asyncio way: sending to a session queue and receiving
one session, with its state and lock, through ``poisonq.servicebus.aio``.

Follows the flow of azure-sdk-for-python's samples/async_samples/session_send_receive_async.py,
written anew in the SDK's idiom; only the import lines and the connection string differ.
"""

import asyncio
import os

from poisonq.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage
from poisonq.servicebus.aio import ServiceBusClient

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
SESSION_QUEUE_NAME = os.environ["SERVICEBUS_SESSION_QUEUE_NAME"]
SESSION_ID = os.environ["SERVICEBUS_SESSION_ID"]


async def send_single_message(sender):
    await sender.send_messages(ServiceBusMessage("Single session message", session_id=SESSION_ID))


async def send_a_list_of_messages(sender):
    messages = [ServiceBusMessage("Session Message in list", session_id=SESSION_ID)] * 10
    await sender.send_messages(messages)


async def send_batch_message(sender):
    batch_message = await sender.create_message_batch()
    for _ in range(10):
        try:
            batch_message.add_message(
                ServiceBusMessage("Session Message inside a batch", session_id=SESSION_ID)
            )
        except ValueError:
            break
    await sender.send_messages(batch_message)


async def receive_batch_message(receiver):
    session = receiver.session
    await session.set_state("START")
    print("Session state:", await session.get_state())
    received_msgs = await receiver.receive_messages(max_message_count=30, max_wait_time=1)
    for msg in received_msgs:
        print(str(msg))
        await receiver.complete_message(msg)
        await session.renew_lock()
    await session.set_state("END")
    print("Session state:", await session.get_state())


async def main():
    servicebus_client = ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR)
    async with servicebus_client:
        sender = servicebus_client.get_queue_sender(queue_name=SESSION_QUEUE_NAME)
        async with sender:
            await send_single_message(sender)
            await send_a_list_of_messages(sender)
            await send_batch_message(sender)

        receiver = servicebus_client.get_queue_receiver(
            queue_name=SESSION_QUEUE_NAME, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
        )
        async with receiver:
            await receive_batch_message(receiver)


asyncio.run(main())
print("Receive is done.")
