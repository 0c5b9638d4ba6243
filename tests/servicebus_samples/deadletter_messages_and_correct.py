"""Dead-letter a message with a reason, read it from the dead-letter queue, send a corrected
copy to the queue, and complete both.

Follows the flow of azure-sdk-for-python's samples/sync_samples/
deadletter_messages_and_correct.py, written anew in the SDK's idiom; only the import line
and the connection string differ.
"""

import os

from poisonq.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
QUEUE_NAME = os.environ["SERVICEBUS_QUEUE_NAME"]

with ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR) as client:
    with client.get_queue_sender(QUEUE_NAME) as sender:
        sender.send_messages(
            [
                ServiceBusMessage("Good", subject="Good"),
                ServiceBusMessage("Bad", subject="Bad", application_properties={"fix": "me"}),
            ]
        )

    with client.get_queue_receiver(QUEUE_NAME, max_wait_time=1) as receiver:
        for msg in receiver.receive_messages(max_message_count=10):
            if msg.subject == "Good":
                receiver.complete_message(msg)
            else:
                receiver.dead_letter_message(
                    msg, reason="Bad message", error_description="subject was Bad"
                )

    dlq = client.get_queue_receiver(
        QUEUE_NAME, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=1
    )
    with dlq, client.get_queue_sender(QUEUE_NAME) as sender:
        for msg in dlq.receive_messages(max_message_count=10):
            assert msg.application_properties[b"fix"] == b"me"
            corrected = ServiceBusMessage(str(msg), subject="Good")
            sender.send_messages(corrected)
            dlq.complete_message(msg)

    with client.get_queue_receiver(QUEUE_NAME, max_wait_time=1) as receiver:
        for msg in receiver.receive_messages(max_message_count=10):
            assert msg.subject == "Good"
            receiver.complete_message(msg)
