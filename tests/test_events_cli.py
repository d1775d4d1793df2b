"""`mooncake-redis events` (text, JSON lines) and its ZMQ publisher in Mooncake's KV event
format, read back by a ZMQ subscriber as a router would."""
from __future__ import annotations

import json
import threading

import msgpack
import pytest
import zmq

from helpers import WRITER, mount, put, run_cli
from mooncake_redis.events import Position
from mooncake_redis.events_zmq import mooncake_event, publish
from mooncake_redis.server import free_port

HASH = "ab" * 32


@pytest.fixture
def store(valkey_master, valkey):
    m = valkey_master(shards=2, kv_events_maxlen=1000, key_profile="sglang")
    mount(m, "10.0.0.1:15000", 1 << 20)
    return m, valkey.url


def test_events_prints_each_event_and_json_lines(store):
    m, url = store
    put(m, "plain key", 100)
    m.remove("plain key")
    text = run_cli("--redis", url, "events")
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    assert len(lines) == 2 and "stored   default/plain key  100 B  memory 10.0.0.1:15000" in lines[0]
    assert "removed  default/plain key" in lines[1]
    got = run_cli("--redis", url, "events", "--json")
    rows = [json.loads(line) for line in got.output.splitlines()]
    assert [(r["event"], r["key"], r["id"]) for r in rows] == [("stored", "plain key", "0-1"), ("removed", "plain key", "0-2")]
    assert all(r["command"] == "events" and r["format"] == 1 for r in rows)


def test_events_says_when_they_are_off(valkey_master, valkey):
    valkey_master(shards=1)
    result = run_cli("--redis", valkey.url, "events")
    assert result.exit_code == 0 and "KV events are off" in result.output


def test_the_mooncake_format_of_each_kind(store):
    m, _ = store
    put(m, f"tag_model_{HASH}_0_k", 64)
    stored, = m.events()
    assert mooncake_event(stored, HASH) == ["BlockStoreEvent", f"tag_model_{HASH}_0_k",
                                            [["memory", "10.0.0.1:15000"]], "", 64, HASH, "", []]
    m.remove(f"tag_model_{HASH}_0_k")
    removed = m.events()[-1]
    assert mooncake_event(removed) == ["BlockUpdateEvent", f"tag_model_{HASH}_0_k", []]


def test_a_subscriber_receives_the_batches(store):
    m, _ = store
    address = f"tcp://127.0.0.1:{free_port()}"
    stop = threading.Event()
    sent: list[tuple[int, int]] = []
    publisher = threading.Thread(target=publish, args=(m, address, stop), daemon=True,
                                 kwargs={"position": Position(), "interval_s": 0.02,
                                         "on_batch": lambda seq, n: sent.append((seq, n))})
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"mooncake")
    sub.setsockopt(zmq.RCVTIMEO, 200)
    try:
        publisher.start()
        sub.connect(address)
        # a subscriber misses what was published before its subscription took (PUB/SUB): probe
        # until one arrives, then take what is in flight
        for i in range(100):
            put(m, f"probe{i}", 10)
            try:
                sub.recv_multipart()
                break
            except zmq.Again:
                continue
        else:
            pytest.fail("no message reached the subscriber")
        while True:
            try:
                sub.recv_multipart()
            except zmq.Again:
                break
        sub.setsockopt(zmq.RCVTIMEO, 10_000)
        put(m, f"x_{HASH}_0_k", 10)
        topic, seq, payload = sub.recv_multipart()
        ts, events = msgpack.unpackb(payload)
        assert topic == b"mooncake" and len(seq) == 8 and isinstance(ts, float)
        assert ["BlockStoreEvent", f"x_{HASH}_0_k"] == events[0][:2] and events[0][5] == HASH
        m.remove(f"x_{HASH}_0_k")
        _, seq2, payload = sub.recv_multipart()
        assert int.from_bytes(seq2, "big") == int.from_bytes(seq, "big") + 1
        assert msgpack.unpackb(payload)[1] == [["BlockUpdateEvent", f"x_{HASH}_0_k", []]]
    finally:
        stop.set()
        publisher.join(10)
        sub.close()
    assert sent and [s for s, _ in sent] == list(range(len(sent)))


def test_zmq_needs_a_usable_address(store):
    _, url = store
    result = run_cli("--redis", url, "events", "--zmq", "nonsense://x")
    assert result.exit_code == 1 and "cannot publish on nonsense://x" in result.output
