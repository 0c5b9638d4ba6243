"""receive_queue.py the SDK's asyncio way: a batch received and completed, then the rest one
at a time by ``async for``, through ``poisonq.servicebus.aio``.

Follows the flow of azure-sdk-for-python's samples/async_samples/receive_queue_async.py and
receive_iterator_queue_async.py; only the import line and the connection string differ.
"""

import asyncio
import os

from poisonq.servicebus.aio import ServiceBusClient

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
QUEUE_NAME = os.environ["SERVICEBUS_QUEUE_NAME"]


async def main():
    servicebus_client = ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR)
    async with servicebus_client:
        receiver = servicebus_client.get_queue_receiver(queue_name=QUEUE_NAME, max_wait_time=1)
        async with receiver:
            for msg in await receiver.receive_messages(max_message_count=10):
                print(str(msg))
                await receiver.complete_message(msg)
            async for msg in receiver:  # ends once no message came for max_wait_time
                print(str(msg))
                await receiver.complete_message(msg)


asyncio.run(main())
print("Receive is done.")
