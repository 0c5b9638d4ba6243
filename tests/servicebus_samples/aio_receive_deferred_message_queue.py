"""receive_deferred_message_queue.py the SDK's asyncio way: messages deferred, then received
again by their sequence numbers and completed, through ``poisonq.servicebus.aio``.

Follows the flow of azure-sdk-for-python's
samples/async_samples/receive_deferred_message_queue_async.py, written anew in the SDK's
idiom; only the import lines and the connection string differ.
"""

import asyncio
import os

from poisonq.servicebus import ServiceBusMessage
from poisonq.servicebus.aio import ServiceBusClient

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
QUEUE_NAME = os.environ["SERVICEBUS_QUEUE_NAME"]


async def main():
    servicebus_client = ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR)

    async with servicebus_client:
        sender = servicebus_client.get_queue_sender(queue_name=QUEUE_NAME)
        messages = [ServiceBusMessage("Message to be deferred") for _ in range(10)]
        async with sender:
            await sender.send_messages(messages)

        receiver = servicebus_client.get_queue_receiver(queue_name=QUEUE_NAME)
        async with receiver:
            received_msgs = await receiver.receive_messages(max_message_count=10, max_wait_time=1)
            deferred_sequenced_numbers = []
            for msg in received_msgs:
                print(f"Deferring msg: {msg}")
                if msg.sequence_number:
                    deferred_sequenced_numbers.append(msg.sequence_number)
                await receiver.defer_message(msg)

            if deferred_sequenced_numbers:
                received_deferred_msg = await receiver.receive_deferred_messages(
                    sequence_numbers=deferred_sequenced_numbers
                )
                for msg in received_deferred_msg:
                    print(f"Completing deferred msg: {msg}")
                    await receiver.complete_message(msg)
            else:
                print("No messages received.")


asyncio.run(main())
print("Receive is done.")
