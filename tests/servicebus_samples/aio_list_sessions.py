"""list_sessions.py the SDK's asyncio way: the listings are async iterators, read by
``async for``, through ``poisonq.servicebus.aio``.

Follows the flow of azure-sdk-for-python's samples/async_samples/list_sessions_async.py,
written anew in the SDK's idiom; only the import line and the connection string differ.
"""

import asyncio
import os
from datetime import UTC, datetime, timedelta

from poisonq.servicebus.aio import ServiceBusClient

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
SESSION_QUEUE_NAME = os.environ["SERVICEBUS_SESSION_QUEUE_NAME"]
TOPIC_NAME = os.environ["SERVICEBUS_TOPIC_NAME"]
SUBSCRIPTION_NAME = os.environ["SERVICEBUS_SUBSCRIPTION_NAME"]


async def list_queue_sessions(servicebus_client):
    async for session_id in servicebus_client.list_queue_sessions(SESSION_QUEUE_NAME):
        print("Queue session:", session_id)


async def list_subscription_sessions(servicebus_client):
    async for session_id in servicebus_client.list_subscription_sessions(
        TOPIC_NAME, SUBSCRIPTION_NAME
    ):
        print("Subscription session:", session_id)


async def list_recently_updated_queue_sessions(servicebus_client):
    state_updated_after = datetime.now(UTC) - timedelta(days=7)
    async for session_id in servicebus_client.list_queue_sessions(
        SESSION_QUEUE_NAME, state_updated_after=state_updated_after
    ):
        print("Recently updated queue session:", session_id)


async def main():
    async with ServiceBusClient.from_connection_string(CONNECTION_STR) as servicebus_client:
        await list_queue_sessions(servicebus_client)
        await list_subscription_sessions(servicebus_client)
        await list_recently_updated_queue_sessions(servicebus_client)


if __name__ == "__main__":
    asyncio.run(main())
