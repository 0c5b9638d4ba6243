"""Managing queues: create, list, get and update (by the properties object and by keyword
arguments), runtime properties, delete.

Follows the flow of azure-sdk-for-python's samples/sync_samples/mgmt_queue.py, written anew
in the SDK's idiom; only the import line and the connection string differ.
"""

import os
import uuid

from poisonq.servicebus.management import ApiVersion, ServiceBusAdministrationClient

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
QUEUE_NAME = "sb_mgmt_queue" + str(uuid.uuid4())


def create_queue(servicebus_mgmt_client):
    servicebus_mgmt_client.create_queue(
        QUEUE_NAME, max_delivery_count=10, dead_lettering_on_message_expiration=True
    )


def list_queues(servicebus_mgmt_client):
    for queue_properties in servicebus_mgmt_client.list_queues():
        print("Queue Name:", queue_properties.name)


def get_and_update_queue(servicebus_mgmt_client):
    queue_properties = servicebus_mgmt_client.get_queue(QUEUE_NAME)
    print("Auto Delete on Idle:", queue_properties.auto_delete_on_idle)
    print("Default Message Time to Live:", queue_properties.default_message_time_to_live)
    queue_properties.max_delivery_count = 5
    servicebus_mgmt_client.update_queue(queue_properties)
    assert servicebus_mgmt_client.get_queue(QUEUE_NAME).max_delivery_count == 5

    queue_properties = servicebus_mgmt_client.get_queue(QUEUE_NAME)
    servicebus_mgmt_client.update_queue(
        queue_properties, max_delivery_count=3, lock_duration="PT45S"
    )
    updated = servicebus_mgmt_client.get_queue(QUEUE_NAME)
    assert (updated.max_delivery_count, updated.lock_duration.total_seconds()) == (3, 45)


def get_queue_runtime_properties(servicebus_mgmt_client):
    runtime = servicebus_mgmt_client.get_queue_runtime_properties(QUEUE_NAME)
    print("Updated at:", runtime.updated_at_utc)
    print("Size in Bytes:", runtime.size_in_bytes)
    print("Message Count:", runtime.total_message_count)
    print("Active Message Count:", runtime.active_message_count)
    print("Scheduled Message Count:", runtime.scheduled_message_count)
    print("Dead-letter Message Count:", runtime.dead_letter_message_count)


def delete_queue(servicebus_mgmt_client):
    servicebus_mgmt_client.delete_queue(QUEUE_NAME)


with ServiceBusAdministrationClient.from_connection_string(
    CONNECTION_STR, api_version=ApiVersion.V2017_04
) as servicebus_mgmt_client:
    create_queue(servicebus_mgmt_client)
    list_queues(servicebus_mgmt_client)
    get_and_update_queue(servicebus_mgmt_client)
    get_queue_runtime_properties(servicebus_mgmt_client)
    delete_queue(servicebus_mgmt_client)
