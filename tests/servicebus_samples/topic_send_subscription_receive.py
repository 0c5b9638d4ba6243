"""Sending to a topic, and receiving what its subscription got.

Follows the flow of azure-sdk-for-python's samples/sync_samples/send_topic.py and
receive_subscription.py, written anew in the SDK's idiom; only the import line and the
connection string differ.
"""

import os

from poisonq.servicebus import ServiceBusClient, ServiceBusMessage

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
TOPIC_NAME = os.environ["SERVICEBUS_TOPIC_NAME"]
SUBSCRIPTION_NAME = os.environ["SERVICEBUS_SUBSCRIPTION_NAME"]

servicebus_client = ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR)
with servicebus_client:
    sender = servicebus_client.get_topic_sender(topic_name=TOPIC_NAME)
    with sender:
        sender.send_messages(ServiceBusMessage("Single Message"))
        sender.send_messages([ServiceBusMessage("Message in list") for _ in range(10)])
        batch_message = sender.create_message_batch()
        for _ in range(10):
            try:
                batch_message.add_message(ServiceBusMessage("Message inside a batch"))
            except ValueError:
                break
        sender.send_messages(batch_message)

    receiver = servicebus_client.get_subscription_receiver(
        topic_name=TOPIC_NAME, subscription_name=SUBSCRIPTION_NAME, max_wait_time=1
    )
    with receiver:
        for msg in receiver.receive_messages(max_message_count=100):
            print(str(msg))
            receiver.complete_message(msg)
print("Receive is done.")
