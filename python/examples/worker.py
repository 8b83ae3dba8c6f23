"""A worker that processes orders and leaves failure handling to the policy.

    cargo run --release -p ricochet-broker -- --data-dir ./data   # in another shell
    python examples/worker.py --url http://127.0.0.1:6650

It prints the schedule of its policy, publishes a few orders (one of them
malformed, one that fails once), then consumes: good orders are acked, a
transient failure is nacked (back after the policy's delay, its delivery
count one higher), an order that can never work is terminated (straight to
the dead-letter tier), and the worker reads the dead letters back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid

import ricochet

POLICY = "backoff:fixed=200ms,max=3"


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", default="http://127.0.0.1:6650")
    a = p.parse_args()

    print(ricochet.explain_policy(POLICY, "nack"))

    topic = f"orders-{uuid.uuid4().hex[:8]}"
    client = await ricochet.Client.connect(a.url)
    consumer = await client.consumer(
        topic, "billing", type="shared", policy=POLICY, initial_position="earliest"
    )
    async with await client.producer(topic) as producer:
        orders = [
            {"id": 1, "amount": 10},
            {"id": 2, "amount": 25, "flaky": True},
            "not json at all",
            {"id": 3, "amount": 7},
        ]
        for o in orders:
            await producer.send(json.dumps(o) if isinstance(o, dict) else o, key="customer-42")

    done = 0
    async for msg in consumer:
        try:
            order = json.loads(msg.payload)
        except ValueError:
            await consumer.terminate(msg, "not JSON")
            print(f"{msg.id}: dead-lettered (not JSON)")
        else:
            if order.get("flaky") and msg.delivery_count == 0:
                await consumer.nack(msg, reason="payment service busy")
                print(f"{msg.id}: nacked, comes back after the policy's delay")
                continue
            await consumer.ack(msg)
            print(f"{msg.id}: order {order['id']} billed (delivery {msg.delivery_count})")
        done += 1
        if done == len(orders):
            break
    await consumer.close()

    async with await client.consumer(
        f"{topic}-billing-DLQ", "ops", initial_position="earliest", dead_letter_reader=True
    ) as dlq:
        dead = await dlq.receive()
        print(f"dead letter: {dead.payload!r} from {dead.origin_message_id}")
        await dlq.ack(dead)


if __name__ == "__main__":
    asyncio.run(main())
