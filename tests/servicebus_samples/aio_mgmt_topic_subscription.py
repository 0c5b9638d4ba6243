"""mgmt_topic.py and mgmt_subscription.py the SDK's asyncio way: create, list, get and
update, runtime properties and delete a topic and its subscription through
``poisonq.servicebus.aio.management``.

Follows the flow of azure-sdk-for-python's samples/async_samples/mgmt_topic_async.py and
mgmt_subscription_async.py, written anew in the SDK's idiom; only the import line and the
connection string differ.
"""

import asyncio
import datetime
import os
import uuid

from poisonq.servicebus.aio.management import ServiceBusAdministrationClient

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
TOPIC_NAME = "sb_mgmt_topic" + str(uuid.uuid4())
SUBSCRIPTION_NAME = "sb_mgmt_sub" + str(uuid.uuid4())


async def main():
    async with ServiceBusAdministrationClient.from_connection_string(CONNECTION_STR) as client:
        await client.create_topic(TOPIC_NAME, max_size_in_megabytes=100)
        async for topic_properties in client.list_topics():
            print("Topic Name:", topic_properties.name)
        topic_properties = await client.get_topic(TOPIC_NAME)
        topic_properties.default_message_time_to_live = datetime.timedelta(minutes=10)
        await client.update_topic(topic_properties)
        await client.update_topic(topic_properties, max_size_in_megabytes=200)
        topic_runtime = await client.get_topic_runtime_properties(TOPIC_NAME)
        print("Subscription Count:", topic_runtime.subscription_count)
        assert topic_runtime.subscription_count == 0

        await client.create_subscription(TOPIC_NAME, SUBSCRIPTION_NAME, max_delivery_count=10)
        async for subscription_properties in client.list_subscriptions(TOPIC_NAME):
            print("Subscription Name:", subscription_properties.name)
        subscription_properties = await client.get_subscription(TOPIC_NAME, SUBSCRIPTION_NAME)
        subscription_properties.max_delivery_count = 5
        await client.update_subscription(TOPIC_NAME, subscription_properties)
        await client.update_subscription(TOPIC_NAME, subscription_properties, lock_duration="PT1M")
        runtime = await client.get_subscription_runtime_properties(TOPIC_NAME, SUBSCRIPTION_NAME)
        print("Message Count:", runtime.total_message_count)
        async for runtime in client.list_subscriptions_runtime_properties(TOPIC_NAME):
            print("Active Message Count:", runtime.active_message_count)
        assert (
            await client.get_subscription(TOPIC_NAME, SUBSCRIPTION_NAME)
        ).max_delivery_count == 5
        assert (await client.get_topic(TOPIC_NAME)).max_size_in_megabytes == 200

        await client.delete_subscription(TOPIC_NAME, SUBSCRIPTION_NAME)
        await client.delete_topic(TOPIC_NAME)


asyncio.run(main())
