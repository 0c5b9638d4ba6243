"""auto_lock_renew.py the SDK's asyncio way: an AutoLockRenewer keeping the locks of
received messages, and of a session, while they are worked on; a coroutine called should a
renewal fail.

Follows the flow of azure-sdk-for-python's samples/async_samples/auto_lock_renew_async.py,
written anew in the SDK's idiom; only the import lines and the connection string differ, and
the sample's long sleeps (and the private renewal period it sets to make one fail) are left
out: the tests of the renewal move a clock instead.
"""

import asyncio
import os

from poisonq.servicebus import ServiceBusMessage
from poisonq.servicebus.aio import AutoLockRenewer, ServiceBusClient
from poisonq.servicebus.exceptions import ServiceBusError

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
QUEUE_NAME = os.environ["SERVICEBUS_QUEUE_NAME"]
SESSION_QUEUE_NAME = os.environ["SERVICEBUS_SESSION_QUEUE_NAME"]


async def renew_lock_on_message_received_from_non_sessionful_entity():
    servicebus_client = ServiceBusClient.from_connection_string(CONNECTION_STR)

    async with servicebus_client:
        async with servicebus_client.get_queue_sender(queue_name=QUEUE_NAME) as sender:
            msgs_to_send = [ServiceBusMessage(f"session message: {i}") for i in range(10)]
            await sender.send_messages(msgs_to_send)

        # Can also be called via "async with AutoLockRenewer() as renewer" to automate shutdown.
        renewer = AutoLockRenewer()

        async with servicebus_client.get_queue_receiver(
            queue_name=QUEUE_NAME, prefetch_count=10
        ) as receiver:
            received_msgs = await receiver.receive_messages(max_message_count=10, max_wait_time=1)
            for msg in received_msgs:
                # automatically renew the lock on each message for 100 seconds
                renewer.register(receiver, msg, max_lock_renewal_duration=100)
            for msg in received_msgs:
                await receiver.complete_message(msg)

        await renewer.close()


async def renew_lock_on_session_of_the_sessionful_entity():
    servicebus_client = ServiceBusClient.from_connection_string(CONNECTION_STR)

    async with servicebus_client:
        async with servicebus_client.get_queue_sender(queue_name=SESSION_QUEUE_NAME) as sender:
            msgs_to_send = [
                ServiceBusMessage(f"session message: {i}", session_id="SESSION") for i in range(10)
            ]
            await sender.send_messages(msgs_to_send)

        renewer = AutoLockRenewer()

        async with servicebus_client.get_queue_receiver(
            queue_name=SESSION_QUEUE_NAME, session_id="SESSION", prefetch_count=10
        ) as receiver:
            # automatically renew the lock on the session for 100 seconds
            renewer.register(receiver, receiver.session, max_lock_renewal_duration=100)
            received_msgs = await receiver.receive_messages(max_message_count=10, max_wait_time=1)
            for msg in received_msgs:
                await receiver.complete_message(msg)

        await renewer.close()


async def renew_lock_with_lock_renewal_failure_callback():
    servicebus_client = ServiceBusClient.from_connection_string(CONNECTION_STR)

    async with servicebus_client:
        async with servicebus_client.get_queue_sender(queue_name=QUEUE_NAME) as sender:
            await sender.send_messages(ServiceBusMessage("message"))

        async with (
            AutoLockRenewer() as renewer,
            servicebus_client.get_queue_receiver(
                queue_name=QUEUE_NAME, prefetch_count=10
            ) as receiver,
        ):

            async def on_lock_renew_failure_callback(renewable, error):
                print(f"Failed to renew lock on {renewable} due to {error}")

            received_msgs = await receiver.receive_messages(max_message_count=1, max_wait_time=1)
            for msg in received_msgs:
                renewer.register(
                    receiver,
                    msg,
                    max_lock_renewal_duration=90,
                    on_lock_renew_failure=on_lock_renew_failure_callback,
                )
            try:
                for msg in received_msgs:
                    await receiver.complete_message(msg)
            except ServiceBusError:
                print("Messages cannot be settled if they have timed out.")


asyncio.run(renew_lock_on_message_received_from_non_sessionful_entity())
asyncio.run(renew_lock_on_session_of_the_sessionful_entity())
asyncio.run(renew_lock_with_lock_renewal_failure_callback())
