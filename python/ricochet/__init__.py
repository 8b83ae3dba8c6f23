"""Ricochet's Python client: asyncio producers and consumers over the Rust
client (``ricochet-client``), so policies, nack and ack-timeout tracking,
reconnects, redirects and receipts behave exactly as in Rust.

    client = await ricochet.Client.connect("http://127.0.0.1:6650")
    producer = await client.producer("orders")
    await producer.send(b"hello")
    consumer = await client.consumer("orders", "billing", policy="backoff:fixed=1s,max=3")
    async for msg in consumer:
        await consumer.ack(msg)
"""

from ._native import (
    Client,
    Consumer,
    Message,
    MessageId,
    PolicySchedule,
    Producer,
    ScheduleRow,
    __version__,
    explain_policy,
    parse_policy,
)
from .errors import *  # noqa: F403
from .errors import __all__ as _errors

__all__ = [
    "Client",
    "Consumer",
    "Message",
    "MessageId",
    "PolicySchedule",
    "Producer",
    "ScheduleRow",
    "explain_policy",
    "parse_policy",
    "__version__",
    *_errors,
]
