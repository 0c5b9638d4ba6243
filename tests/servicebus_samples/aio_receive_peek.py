"""receive_peek.py the SDK's asyncio way: peeking at a queue's messages, which locks nothing
and counts no delivery, through ``poisonq.servicebus.aio``.

Follows the flow of azure-sdk-for-python's samples/async_samples/receive_peek_async.py,
written anew in the SDK's idiom; only the import line and the connection string differ.
"""

import asyncio
import os

from poisonq.servicebus.aio import ServiceBusClient

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
QUEUE_NAME = os.environ["SERVICEBUS_QUEUE_NAME"]


async def main():
    servicebus_client = ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR)
    async with servicebus_client:
        receiver = servicebus_client.get_queue_receiver(queue_name=QUEUE_NAME)
        async with receiver:
            received_msgs = await receiver.peek_messages(max_message_count=2)
            for msg in received_msgs:
                print(str(msg))
            more = await receiver.peek_messages(
                max_message_count=100, sequence_number=received_msgs[-1].sequence_number + 1
            )
            print(f"{len(more)} more after them")


asyncio.run(main())
print("Peek is done.")
