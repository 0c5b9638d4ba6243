"""Dead-lettering received messages, then receiving them from the dead-letter subqueue.

Follows the flow of azure-sdk-for-python's samples/sync_samples/
receive_deadlettered_messages.py, written anew in the SDK's idiom; only the import line and
the connection string differ.
"""

import os

from poisonq.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
QUEUE_NAME = os.environ["SERVICEBUS_QUEUE_NAME"]

servicebus_client = ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR)
with servicebus_client:
    sender = servicebus_client.get_queue_sender(queue_name=QUEUE_NAME)
    with sender:
        sender.send_messages([ServiceBusMessage("Message to be deadlettered") for _ in range(10)])

    receiver = servicebus_client.get_queue_receiver(queue_name=QUEUE_NAME, max_wait_time=1)
    with receiver:
        for msg in receiver.receive_messages(max_message_count=10):
            receiver.dead_letter_message(
                msg, reason="ProcessingError", error_description="Failed to process the message"
            )

    dlq_receiver = servicebus_client.get_queue_receiver(
        queue_name=QUEUE_NAME, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=1
    )
    with dlq_receiver:
        for msg in dlq_receiver.receive_messages(max_message_count=5):
            print(msg.dead_letter_reason, msg.dead_letter_error_description)
            dlq_receiver.complete_message(msg)
print("Receive is done.")
