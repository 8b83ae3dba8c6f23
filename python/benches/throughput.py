"""Publish and consume+ack throughput of the Python client, to compare with
the Rust client's `ricochet perf produce` / `perf consume` on the same broker.

    python benches/throughput.py --url http://127.0.0.1:6650 --messages 200000 --size 128

Publish: one producer, `--messages` payloads of `--size` bytes, at most
`--window` sends awaiting their receipt (the Rust perf default
`--max-pending 1000`), default batching (1000 messages / 128 KiB / 1 ms linger).
Consume+ack: one Shared consumer (receiver queue 1000, acks grouped by the
client every 100 ms) drains what was published, acking each message, then
`flush` (every ack confirmed durable) before the clock stops.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time
import uuid

import ricochet


async def publish(producer: ricochet.Producer, n: int, size: int, window: int) -> float:
    payload = b"x" * size
    pending: collections.deque = collections.deque()
    start = time.perf_counter()
    for _ in range(n):
        pending.append(producer.send(payload))
        if len(pending) >= window:
            await pending.popleft()
    while pending:
        await pending.popleft()
    return time.perf_counter() - start


async def consume(consumer: ricochet.Consumer, n: int) -> float:
    start = time.perf_counter()
    got = 0
    async for msg in consumer:
        await consumer.ack(msg)
        got += 1
        if got == n:
            break
    await consumer.flush()
    return time.perf_counter() - start


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:6650")
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--window", type=int, default=1000)
    p.add_argument("--topic", default=f"pybench-{uuid.uuid4().hex[:8]}")
    a = p.parse_args()

    client = await ricochet.Client.connect(a.url)
    consumer = await client.consumer(a.topic, "bench", type="shared", receiver_queue_size=1000)
    producer = await client.producer(a.topic)
    # Warm up the connection and the stream.
    await producer.send(b"warm-up")
    warm = await consumer.receive()
    await consumer.ack(warm)

    secs = await publish(producer, a.messages, a.size, a.window)
    print(
        f"publish: {a.messages} msgs of {a.size} B in {secs:.2f} s = {a.messages / secs:,.0f} msg/s "
        f"({a.messages * a.size / secs / 1e6:.1f} MB/s), window {a.window}"
    )
    secs = await consume(consumer, a.messages)
    print(
        f"consume+ack: {a.messages} msgs of {a.size} B in {secs:.2f} s = {a.messages / secs:,.0f} msg/s"
    )
    await producer.close()
    await consumer.close()


if __name__ == "__main__":
    asyncio.run(main())
