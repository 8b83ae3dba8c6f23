"""The Python client against a real broker process: produce and consume, a
nack that comes back counted, a message that ends in the dead-letter tier,
and producer and consumer carrying on across a broker kill and restart."""

from __future__ import annotations

import asyncio
import uuid

import pytest

import ricochet


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def receive(consumer: ricochet.Consumer, timeout: float = 20.0) -> ricochet.Message:
    return await asyncio.wait_for(consumer.receive(), timeout)


def test_produce_and_consume(broker):
    async def main():
        client = await ricochet.Client.connect(broker.url)
        topic = unique("orders")
        consumer = await client.consumer(topic, "billing", initial_position="earliest")
        producer = await client.producer(topic, name="py-producer")
        n = 500
        ids = await asyncio.gather(
            *[producer.send(f"order {i}", key=f"k{i}", properties={"n": str(i)}) for i in range(n)]
        )
        # Concurrent sends are stored in call order.
        assert [i.entry_id for i in ids] == sorted(i.entry_id for i in ids)
        assert len(set(ids)) == n
        await producer.send(b"\x00raw\xff")
        got = []
        async for msg in consumer:
            got.append(msg)
            await consumer.ack(msg)
            if len(got) == n + 1:
                break
        assert [m.text() for m in got[:n]] == [f"order {i}" for i in range(n)]
        assert got[n].payload == b"\x00raw\xff"
        assert [m.id for m in got[:n]] == list(ids)
        first = got[0]
        assert (first.key, first.properties, first.delivery_count) == ("k0", {"n": "0"}, 0)
        assert first.topic == f"persistent://public/default/{topic}"
        assert first.producer_name == "py-producer"
        assert not first.is_retry and first.real_topic is None
        await consumer.flush()
        await consumer.close()
        # The iteration of a closed consumer ends; settling raises ClosedError.
        assert [m async for m in consumer] == []
        with pytest.raises(ricochet.ClosedError):
            await consumer.ack(first)
        await producer.close()
        with pytest.raises(ricochet.ClosedError):
            await producer.send(b"late")

    run(main())


@pytest.mark.parametrize("local", [None, True, False])
def test_a_nack_comes_back_with_a_higher_delivery_count(broker, local):
    async def main():
        client = await ricochet.Client.connect(broker.url)
        topic = unique("nacks")
        consumer = await client.consumer(
            topic,
            "s",
            initial_position="earliest",
            policy="backoff:fixed=100ms,max=5",
            local_redelivery=local,
        )
        producer = await client.producer(topic)
        sent = await producer.send(b"flaky")
        first = await receive(consumer)
        assert (first.id, first.delivery_count) == (sent, 0)
        await consumer.nack(first, reason="not yet")
        again = await receive(consumer)
        assert (again.id, again.payload, again.delivery_count) == (sent, b"flaky", 1)
        await consumer.nack(again)
        third = await receive(consumer)
        assert third.delivery_count == 2
        await consumer.ack(third)
        await consumer.close()

    run(main())


def test_a_message_ends_in_the_dead_letter_tier(broker):
    async def main():
        client = await ricochet.Client.connect(broker.url)
        topic = unique("poison")
        consumer = await client.consumer(
            topic, "s", initial_position="earliest", policy="backoff:fixed=100ms,max=1"
        )
        producer = await client.producer(topic)
        sent = await producer.send(b"poison", key="p1", properties={"origin": "test"})
        keep = await producer.send(b"fine")
        attempts = []
        ok = None
        while ok is None or len(attempts) < 2:
            msg = await receive(consumer)
            if msg.payload == b"fine":
                ok = msg
                await consumer.ack(msg)
                continue
            attempts.append(msg.delivery_count)
            await consumer.nack(msg, reason="cannot parse")
        # max=1: one redelivery, then the second nack dead-letters it.
        assert attempts == [0, 1]
        assert ok.id == keep
        await consumer.flush()
        dlq = await client.consumer(
            f"{topic}-s-DLQ", "inspect", initial_position="earliest", dead_letter_reader=True
        )
        dead = await receive(dlq)
        assert dead.payload == b"poison"
        assert dead.key == "p1"
        assert dead.properties["origin"] == "test"
        assert dead.real_topic == f"persistent://public/default/{topic}"
        assert dead.origin_message_id == str(sent)
        await dlq.ack(dead)
        await dlq.close()
        # Nothing more on the main subscription.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(consumer.receive(), 1.0)
        await consumer.close()

    run(main())


def test_terminate_and_reconsume_later(broker):
    async def main():
        client = await ricochet.Client.connect(broker.url)
        topic = unique("tiers")
        consumer = await client.consumer(
            topic, "s", initial_position="earliest", policy="delay-levels", ack_receipts=True
        )
        producer = await client.producer(topic)
        later = await producer.send(b"later")
        doomed = await producer.send(b"doomed")
        a = await receive(consumer)
        b = await receive(consumer)
        assert (a.id, b.id) == (later, doomed)
        await consumer.reconsume_later(a, delay=0.2, properties={"why": "busy"})
        await consumer.terminate(b, "unprocessable")
        retried = await receive(consumer)
        assert retried.payload == b"later" and retried.is_retry
        assert retried.topic.endswith(f"{topic}-s-RETRY")
        assert retried.origin_message_id == str(later)
        assert retried.properties["why"] == "busy"
        assert retried.delivery_count == 1
        await consumer.ack(retried)
        with pytest.raises(ricochet.InvalidArgumentError):
            await consumer.reconsume_later(retried, delay=1, level=2)
        await consumer.close()
        dlq = await client.consumer(
            f"{topic}-s-DLQ", "inspect", initial_position="earliest", dead_letter_reader=True
        )
        dead = await receive(dlq)
        assert dead.payload == b"doomed"
        await dlq.close()

    run(main())


def test_producer_and_consumer_carry_on_after_a_broker_restart(broker):
    async def main():
        client = await ricochet.Client.connect(broker.url, reconnect_min=0.05, reconnect_max=0.5)
        topic = unique("restart")
        consumer = await client.consumer(topic, "s", initial_position="earliest")
        producer = await client.producer(topic)
        before = await producer.send(b"before")
        m = await receive(consumer)
        assert m.id == before
        await consumer.ack(m)
        await consumer.flush()

        broker.kill()
        # While it is down: queued, not receipted.
        pending = asyncio.ensure_future(producer.send(b"during"))
        await asyncio.sleep(0.5)
        assert not pending.done()
        broker.start()

        during = await asyncio.wait_for(pending, 30)
        after = await producer.send(b"after")
        got = [await receive(consumer, 30), await receive(consumer, 30)]
        assert [g.payload for g in got] == [b"during", b"after"]
        assert [g.id for g in got] == [during, after]
        # The ack made durable before the kill held: "before" is not redelivered.
        assert all(g.delivery_count == 0 for g in got)
        for g in got:
            await consumer.ack(g)
        await consumer.close()
        await producer.close()

    run(main())


def test_bad_input_raises_typed_errors(broker):
    async def main():
        client = await ricochet.Client.connect(broker.url)
        with pytest.raises(ricochet.PolicyError) as e:
            await client.consumer("t", "s", policy="backoff:fixed=1s")
        assert e.value.kind == "policy"
        assert isinstance(e.value, ValueError)
        with pytest.raises(ricochet.InvalidArgumentError):
            await client.consumer("t", "s", type="round-robin")
        with pytest.raises(ricochet.InvalidArgumentError):
            await client.consumer("t", "s", ack_timeout=-1)
        with pytest.raises(ricochet.InvalidArgumentError) as e:
            await client.producer("bad topic name!")
        assert e.value.grpc_code == 3
        producer = await client.producer(unique("types"))
        with pytest.raises(ricochet.InvalidArgumentError):
            await producer.send(12345)
        await producer.close()
        # Exclusive: a second consumer is refused by the broker.
        topic = unique("excl")
        first = await client.consumer(topic, "s")
        with pytest.raises(ricochet.RicochetError) as e:
            await client.consumer(topic, "s")
        assert e.value.kind == "failed_precondition"
        assert isinstance(e.value, ricochet.FailedPreconditionError)
        await first.close()
        with pytest.raises(ricochet.DisconnectedError) as e:
            await ricochet.Client.connect("http://127.0.0.1:1", connect_timeout=2)
        assert e.value.retryable and e.value.grpc_code is None

    run(main())


def test_explain_policy_is_the_policy_crates_schedule():
    s = ricochet.explain_policy("backoff:min=10s,max-delay=10m,multiplier=2,max=3", "nack")
    assert [(r.attempt, r.delay, r.cumulative, r.tier, r.dead_letter) for r in s.rows] == [
        (1, 10.0, 10.0, "main", False),
        (2, 20.0, 30.0, "main", False),
        (3, 40.0, 70.0, "main", False),
        (4, None, 70.0, None, True),
    ]
    assert str(s).startswith("policy: backoff:min=10s,max-delay=10m,multiplier=2,jitter=0,max=3\nreason: nack\n")
    assert not s.truncated
    levels = ricochet.explain_policy("delay-levels", "reconsume_later")
    assert len(levels.rows) == 17 and levels.rows[0].tier == "retry"
    assert ricochet.parse_policy("pulsar:fixed=1m,max=5") == "backoff:fixed=1m,max=5"
    with pytest.raises(ricochet.PolicyError):
        ricochet.parse_policy("backoff:fixed=60s")
    with pytest.raises(ricochet.PolicyError):
        ricochet.explain_policy("delay-levels", "sometimes")


def test_concurrent_sends_keep_call_order_while_the_queue_is_full(broker):
    async def main():
        client = await ricochet.Client.connect(broker.url)
        topic = unique("order")
        # A queue of 4: most sends wait for room, and must still be stored
        # in the order they were called.
        producer = await client.producer(topic, max_pending_messages=4)
        n = 300
        ids = await asyncio.gather(*[producer.send(str(i)) for i in range(n)])
        entries = [i.entry_id for i in ids]
        assert entries == sorted(entries), "stored out of call order"
        consumer = await client.consumer(topic, "s", initial_position="earliest")
        got = []
        async for msg in consumer:
            got.append(msg.text())
            await consumer.ack(msg)
            if len(got) == n:
                break
        assert got == [str(i) for i in range(n)]
        await consumer.close()
        # Fail fast instead of waiting: QueueFullError once 1 is pending.
        fast = await client.producer(topic, max_pending_messages=1, block_if_queue_full=False)
        results = await asyncio.gather(*[fast.send(b"x") for _ in range(50)], return_exceptions=True)
        assert any(isinstance(r, ricochet.QueueFullError) for r in results)
        assert any(isinstance(r, ricochet.MessageId) for r in results)
        await fast.close()
        await producer.close()

    run(main())


def test_close_ends_an_iteration_waiting_for_messages(broker):
    async def main():
        client = await ricochet.Client.connect(broker.url)
        consumer = await client.consumer(unique("idle"), "s")

        async def drain():
            return [m async for m in consumer]

        task = asyncio.ensure_future(drain())
        await asyncio.sleep(0.3)
        assert not task.done()
        # close must not wait behind the pending receive, and ends the loop.
        await asyncio.wait_for(consumer.close(), 10)
        assert await asyncio.wait_for(task, 10) == []
        with pytest.raises(ricochet.ClosedError):
            await consumer.receive()

    run(main())
