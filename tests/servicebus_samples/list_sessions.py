"""Listing sessions: those of a queue and of a subscription with messages or a stored state,
and those whose state was set in the past week.

Follows the flow of azure-sdk-for-python's samples/sync_samples/list_sessions.py, written anew
in the SDK's idiom; only the import line and the connection string differ.
"""

import os
from datetime import UTC, datetime, timedelta

from poisonq.servicebus import ServiceBusClient

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
SESSION_QUEUE_NAME = os.environ["SERVICEBUS_SESSION_QUEUE_NAME"]
TOPIC_NAME = os.environ["SERVICEBUS_TOPIC_NAME"]
SUBSCRIPTION_NAME = os.environ["SERVICEBUS_SUBSCRIPTION_NAME"]


def list_queue_sessions(servicebus_client):
    for session_id in servicebus_client.list_queue_sessions(SESSION_QUEUE_NAME):
        print("Queue session:", session_id)


def list_subscription_sessions(servicebus_client):
    for session_id in servicebus_client.list_subscription_sessions(TOPIC_NAME, SUBSCRIPTION_NAME):
        print("Subscription session:", session_id)


def list_recently_updated_queue_sessions(servicebus_client):
    state_updated_after = datetime.now(UTC) - timedelta(days=7)
    for session_id in servicebus_client.list_queue_sessions(
        SESSION_QUEUE_NAME, state_updated_after=state_updated_after
    ):
        print("Recently updated queue session:", session_id)


with ServiceBusClient.from_connection_string(CONNECTION_STR) as servicebus_client:
    list_queue_sessions(servicebus_client)
    list_subscription_sessions(servicebus_client)
    list_recently_updated_queue_sessions(servicebus_client)
