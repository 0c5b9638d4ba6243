"""session_pool_receive.py the SDK's asyncio way: five receivers on one event loop take the
next available session in turn, each session's lock kept by an AutoLockRenewer, until no
session is left.

Follows the flow of azure-sdk-for-python's samples/async_samples/session_pool_receive_async.py,
written anew in the SDK's idiom; only the import lines and the connection string differ, and
the client is closed at the end (the sample leaves it open, which leaves a PostgreSQL
connection open, an error in the test suite).
"""

import asyncio
import os
import uuid

from poisonq.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage
from poisonq.servicebus.aio import AutoLockRenewer, ServiceBusClient
from poisonq.servicebus.exceptions import OperationTimeoutError

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
# Note: This must be a session-enabled queue.
SESSION_QUEUE_NAME = os.environ["SERVICEBUS_SESSION_QUEUE_NAME"]


async def message_processing(servicebus_client, queue_name):
    while True:
        try:
            async with servicebus_client.get_queue_receiver(
                queue_name, max_wait_time=1, session_id=NEXT_AVAILABLE_SESSION
            ) as receiver:
                renewer = AutoLockRenewer()
                renewer.register(receiver, receiver.session)
                await receiver.session.set_state("OPEN")
                async for message in receiver:
                    print(f"Message: {message}")
                    print(f"Time to live: {message.time_to_live}")
                    print(f"Sequence number: {message.sequence_number}")
                    print(f"Enqueue Sequence number: {message.enqueued_sequence_number}")
                    print(f"Partition Key: {message.partition_key}")
                    print(f"Locked until: {message.locked_until_utc}")
                    print(f"Lock Token: {message.lock_token}")
                    print(f"Enqueued time: {message.enqueued_time_utc}")
                    await receiver.complete_message(message)
                    if str(message) == "shutdown":
                        await receiver.session.set_state("CLOSED")
                        break
                await renewer.close()
        except OperationTimeoutError:
            print("No non-empty session is left; exiting.")
            return


async def sample_session_send_receive_with_pool_async(connection_string, queue_name):
    concurrent_receivers = 5
    sessions = [str(uuid.uuid4()) for i in range(concurrent_receivers)]
    client = ServiceBusClient.from_connection_string(connection_string)

    for session_id in sessions:
        async with client.get_queue_sender(queue_name) as sender:
            await asyncio.gather(
                *[
                    sender.send_messages(
                        ServiceBusMessage(f"Sample message no. {i}", session_id=session_id)
                    )
                    for i in range(20)
                ]
            )
            await sender.send_messages(ServiceBusMessage("shutdown", session_id=session_id))

    receive_sessions = [message_processing(client, queue_name) for _ in range(concurrent_receivers)]
    await asyncio.gather(*receive_sessions)
    await client.close()


if __name__ == "__main__":
    asyncio.run(sample_session_send_receive_with_pool_async(CONNECTION_STR, SESSION_QUEUE_NAME))
