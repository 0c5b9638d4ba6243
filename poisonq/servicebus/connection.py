"""What a client is given to connect: the store URL in place of a connection string, and
the SDK's keyword options, each kept, accepted without effect, or refused by name. No I/O:
the asyncio flavour shares these checks."""

from __future__ import annotations

from typing import Any

from poisonq.model import ReceiveMode, SubQueue
from poisonq.servicebus.constants import (
    ServiceBusReceiveMode,
    ServiceBusSessionFilter,
    native_receive_mode,
    native_sub_queue,
)
from poisonq.servicebus.exceptions import FeatureNotSupportedError

STORE_SCHEMES = ("sqlite:", "postgresql:", "postgres:")
RETRY_OPTIONS = ("retry_total", "retry_backoff_factor", "retry_backoff_max")
WITHOUT_EFFECT = frozenset(
    {
        "logging_enable",  # poisonq logs through logging.getLogger("poisonq...") anyway
        "user_agent",
        "transport_type",  # there is no AMQP connection
        "socket_timeout",
        "keep_alive",
        "client_identifier",
        "try_timeout",
        "timeout",
    }
)
UNSUPPORTED = {
    "http_proxy": "proxies",
    "custom_endpoint_address": "custom endpoints",
    "connection_verify": "TLS certificate options (connection_verify)",
    "ssl_context": "TLS certificate options (ssl_context)",
    "uamqp_transport": "the uAMQP transport",
    "credential": "credentials",
}


def store_url(text: object) -> str:
    """The store URL a client connects to; a Service Bus connection string or namespace is
    refused with what to pass instead."""
    if not isinstance(text, str):
        raise TypeError(f"pass the store URL as a str, not {type(text).__name__}")
    if text.startswith(STORE_SCHEMES):
        return text
    if "Endpoint=" in text or "SharedAccessKey" in text:
        what = "Service Bus connection strings"
    else:
        what = f"a Service Bus namespace ({text!r})"
    raise FeatureNotSupportedError(
        what, "pass the poisonq store URL instead (sqlite:///path/queues.db or postgresql://...)"
    )


def check_client_options(options: dict[str, Any], handler: bool = False) -> dict[str, Any]:
    """The retry options poisonq keeps of a client's keyword options (``retry_total``,
    ``retry_backoff_factor``, ``retry_backoff_max``: poisonq's own, apart from any
    message's delivery count); the rest are accepted without effect or refused by name.
    A sender or receiver (``handler``) takes no retry options of its own here."""
    kept: dict[str, Any] = {}
    for name, value in options.items():
        if name in UNSUPPORTED:
            raise FeatureNotSupportedError(UNSUPPORTED[name])
        if name == "retry_mode":
            if str(value).lower() != "exponential":
                raise FeatureNotSupportedError(f"retry_mode={value!r}", "retries are exponential")
        elif name in RETRY_OPTIONS and not handler:
            kept[name] = value
        elif name not in WITHOUT_EFFECT:
            raise TypeError(f"unexpected keyword argument {name!r}")
    return kept


def receiver_options(
    session_id: str | ServiceBusSessionFilter | None,
    sub_queue: str | None,
    receive_mode: ServiceBusReceiveMode | str,
    max_wait_time: float | None,
    prefetch_count: int,
) -> tuple[SubQueue | None, ReceiveMode]:
    """A receiver's options checked, as poisonq's subqueue and receive mode. A session
    receiver works in peek-lock only (poisonq's session receivers settle under the session's
    lock), and on the entity itself."""
    subqueue, mode = native_sub_queue(sub_queue), native_receive_mode(receive_mode)
    if max_wait_time is not None and max_wait_time <= 0:
        raise ValueError("max_wait_time must be greater than 0")
    if prefetch_count < 0:
        raise ValueError("prefetch_count must be 0 or greater")
    if session_id is not None and mode is ReceiveMode.RECEIVE_AND_DELETE:
        raise FeatureNotSupportedError(
            "RECEIVE_AND_DELETE on a session receiver", "receive in PEEK_LOCK and complete"
        )
    if session_id is not None and subqueue is not None:
        raise FeatureNotSupportedError("sessions on a subqueue", "receive without session_id")
    return subqueue, mode


def receive_count(max_message_count: int | None, max_wait_time: float | None) -> int:
    """How many messages a receive or a peek asks for (``None``: one), checked with its
    wait."""
    count = 1 if max_message_count is None else max_message_count
    if count < 1:
        raise ValueError("max_message_count must be 1 or greater")
    if max_wait_time is not None and max_wait_time <= 0:
        raise ValueError("max_wait_time must be greater than 0")
    return count
