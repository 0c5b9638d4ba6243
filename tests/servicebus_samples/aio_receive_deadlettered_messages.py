"""receive_deadlettered_messages.py the SDK's asyncio way: dead-lettering received messages,
then receiving them from the queue's dead-letter subqueue, through
``poisonq.servicebus.aio``.

Follows the flow of azure-sdk-for-python's
samples/async_samples/receive_deadlettered_messages_async.py, written anew in the SDK's
idiom; only the import lines and the connection string differ.
"""

import asyncio
import os

from poisonq.servicebus import ServiceBusMessage, ServiceBusSubQueue
from poisonq.servicebus.aio import ServiceBusClient

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
QUEUE_NAME = os.environ["SERVICEBUS_QUEUE_NAME"]


async def main():
    servicebus_client = ServiceBusClient.from_connection_string(conn_str=CONNECTION_STR)

    async with servicebus_client:
        sender = servicebus_client.get_queue_sender(queue_name=QUEUE_NAME)
        messages = [ServiceBusMessage("Message to be deadlettered") for _ in range(10)]
        async with sender:
            await sender.send_messages(messages)

        print("dead lettering messages")
        receiver = servicebus_client.get_queue_receiver(queue_name=QUEUE_NAME)
        async with receiver:
            received_msgs = await receiver.receive_messages(max_message_count=10, max_wait_time=1)
            for msg in received_msgs:
                print(str(msg))
                await receiver.dead_letter_message(
                    msg, reason="ProcessingError", error_description="Failed to process the message"
                )

        print("receiving deadlettered messages")
        dlq_receiver = servicebus_client.get_queue_receiver(
            queue_name=QUEUE_NAME, sub_queue=ServiceBusSubQueue.DEAD_LETTER, prefetch_count=10
        )
        async with dlq_receiver:
            received_msgs = await dlq_receiver.receive_messages(
                max_message_count=5, max_wait_time=1
            )
            for msg in received_msgs:
                print(msg.dead_letter_reason, msg.dead_letter_error_description)
                await dlq_receiver.complete_message(msg)


asyncio.run(main())
