"""Managing a topic and its subscriptions: create, list, get and update, runtime
properties, delete.

Follows the flow of azure-sdk-for-python's samples/sync_samples/mgmt_topic.py and
mgmt_subscription.py, written anew in the SDK's idiom; only the import line and the
connection string differ.
"""

import datetime
import os
import uuid

from poisonq.servicebus.management import ServiceBusAdministrationClient

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
TOPIC_NAME = "sb_mgmt_topic" + str(uuid.uuid4())
SUBSCRIPTION_NAME = "sb_mgmt_sub" + str(uuid.uuid4())

with ServiceBusAdministrationClient.from_connection_string(CONNECTION_STR) as client:
    client.create_topic(TOPIC_NAME, max_size_in_megabytes=100)
    for topic_properties in client.list_topics():
        print("Topic Name:", topic_properties.name)
    topic_properties = client.get_topic(TOPIC_NAME)
    topic_properties.default_message_time_to_live = datetime.timedelta(minutes=10)
    client.update_topic(topic_properties)
    client.update_topic(topic_properties, max_size_in_megabytes=200)
    topic_runtime = client.get_topic_runtime_properties(TOPIC_NAME)
    print("Subscription Count:", topic_runtime.subscription_count)
    assert topic_runtime.subscription_count == 0

    client.create_subscription(TOPIC_NAME, SUBSCRIPTION_NAME, max_delivery_count=10)
    for subscription_properties in client.list_subscriptions(TOPIC_NAME):
        print("Subscription Name:", subscription_properties.name)
    subscription_properties = client.get_subscription(TOPIC_NAME, SUBSCRIPTION_NAME)
    subscription_properties.max_delivery_count = 5
    client.update_subscription(TOPIC_NAME, subscription_properties)
    client.update_subscription(TOPIC_NAME, subscription_properties, lock_duration="PT1M")
    runtime = client.get_subscription_runtime_properties(TOPIC_NAME, SUBSCRIPTION_NAME)
    print("Message Count:", runtime.total_message_count)
    assert client.get_subscription(TOPIC_NAME, SUBSCRIPTION_NAME).max_delivery_count == 5
    assert client.get_topic(TOPIC_NAME).max_size_in_megabytes == 200

    client.delete_subscription(TOPIC_NAME, SUBSCRIPTION_NAME)
    client.delete_topic(TOPIC_NAME)
