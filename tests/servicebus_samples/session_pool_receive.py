"""Receiving every session of a queue, one after another, until none is left: accepting
NEXT_AVAILABLE_SESSION raises OperationTimeoutError when no session comes in time.

Follows the flow of azure-sdk-for-python's samples/sync_samples/session_pool_receive.py,
written anew in the SDK's idiom (one worker instead of a pool); only the import lines and the
connection string differ.
"""

import os

from poisonq.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
from poisonq.servicebus.exceptions import OperationTimeoutError

CONNECTION_STR = os.environ["SERVICEBUS_CONNECTION_STR"]
SESSION_QUEUE_NAME = os.environ["SERVICEBUS_SESSION_QUEUE_NAME"]


def message_processing(servicebus_client, queue_name):
    while True:
        try:
            with servicebus_client.get_queue_receiver(
                queue_name, max_wait_time=1, session_id=NEXT_AVAILABLE_SESSION
            ) as receiver:
                receiver.session.set_state("OPEN")
                for message in receiver:
                    print(f"Message: {message}, session {receiver.session.session_id}")
                    receiver.complete_message(message)
                receiver.session.set_state("CLOSED")
        except OperationTimeoutError:
            print("No sessions left, stopping.")
            return


with ServiceBusClient.from_connection_string(CONNECTION_STR) as client:
    with client.get_queue_sender(SESSION_QUEUE_NAME) as sender:
        for session in ("a", "b", "c"):
            sender.send_messages([ServiceBusMessage("Sample message", session_id=session)] * 3)
    message_processing(client, SESSION_QUEUE_NAME)
