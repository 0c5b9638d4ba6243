"""mgmt_queue.py the SDK's asyncio way: create, list, get and update, runtime properties and
delete a queue through ``poisonq.servicebus.aio.management``.

Follows the flow of azure-sdk-for-python's samples/async_samples/mgmt_queue_async.py, written
anew in the SDK's idiom; only the import line and the connection string differ.
"""

import asyncio
import os
import uuid

from poisonq.servicebus.aio.management import ServiceBusAdministrationClient

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
QUEUE_NAME = "sb_mgmt_queue" + str(uuid.uuid4())


async def create_queue(servicebus_mgmt_client):
    print("-- Create Queue")
    await servicebus_mgmt_client.create_queue(
        QUEUE_NAME, max_delivery_count=10, dead_lettering_on_message_expiration=True
    )
    print(f"Queue {QUEUE_NAME} is created.")


async def delete_queue(servicebus_mgmt_client):
    print("-- Delete Queue")
    await servicebus_mgmt_client.delete_queue(QUEUE_NAME)
    print(f"Queue {QUEUE_NAME} is deleted.")


async def list_queues(servicebus_mgmt_client):
    print("-- List Queues")
    async for queue_properties in servicebus_mgmt_client.list_queues():
        print("Queue Name:", queue_properties.name)


async def get_and_update_queue(servicebus_mgmt_client):
    print("-- Get and Update Queue")
    queue_properties = await servicebus_mgmt_client.get_queue(QUEUE_NAME)
    print("Queue Name:", queue_properties.name)
    print("Auto Delete on Idle:", queue_properties.auto_delete_on_idle)
    print("Default Message Time to Live:", queue_properties.default_message_time_to_live)
    print("Dead Lettering on Expiration:", queue_properties.dead_lettering_on_message_expiration)
    queue_properties.max_delivery_count = 5
    await servicebus_mgmt_client.update_queue(queue_properties)

    queue_properties = await servicebus_mgmt_client.get_queue(QUEUE_NAME)
    await servicebus_mgmt_client.update_queue(
        queue_properties, max_delivery_count=3, lock_duration="PT45S"
    )


async def get_queue_runtime_properties(servicebus_mgmt_client):
    print("-- Get Queue Runtime Properties")
    queue_runtime_properties = await servicebus_mgmt_client.get_queue_runtime_properties(QUEUE_NAME)
    print("Queue Name:", queue_runtime_properties.name)
    print("Updated at:", queue_runtime_properties.updated_at_utc)
    print("Size in Bytes:", queue_runtime_properties.size_in_bytes)
    print("Message Count:", queue_runtime_properties.total_message_count)
    print("Active Message Count:", queue_runtime_properties.active_message_count)
    print("Scheduled Message Count:", queue_runtime_properties.scheduled_message_count)
    print("Dead-letter Message Count:", queue_runtime_properties.dead_letter_message_count)


async def main():
    async with ServiceBusAdministrationClient.from_connection_string(
        CONNECTION_STR
    ) as servicebus_mgmt_client:
        await create_queue(servicebus_mgmt_client)
        await list_queues(servicebus_mgmt_client)
        await get_and_update_queue(servicebus_mgmt_client)
        queue = await servicebus_mgmt_client.get_queue(QUEUE_NAME)
        assert (queue.max_delivery_count, queue.lock_duration.total_seconds()) == (3, 45)
        await get_queue_runtime_properties(servicebus_mgmt_client)
        await delete_queue(servicebus_mgmt_client)


asyncio.run(main())
