"""The KV events in Mooncake's publisher format (its KV Event Subscriber Guide,
docs/source/design/kv-event/mooncake_event_subscriber_guide.md in kvcache-ai/Mooncake), over
ZMQ PUB, for KV-aware routers written against Mooncake's `--enable_kv_events`.

Each message has three parts: the topic, an 8-byte big-endian sequence number (this publisher's
batches: 0, 1, 2, ...) and a MessagePack EventBatch [ts (seconds, a double), [event, ...]]:
  stored           -> ["BlockStoreEvent", key, replicas, model_name "", block_size (the object's
                      size), block_hash (the key's prefix hash, "" if its key has none),
                      parent_block_hash "", token_ids []]
  updated          -> ["BlockUpdateEvent", key, replicas]
  removed, evicted -> ["BlockUpdateEvent", key, []] (the object has no replica left)
with replicas [["memory", <segment>], ..., ["local_disk", <client>], ...]. Needs pyzmq and
msgpack (`pip install 'mooncake-redis[events]'`)."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable

from .events import KVEvent, Position
from .keys import prefix_of

TOPIC = "mooncake"


def mooncake_event(ev: KVEvent, block_hash: str = "") -> list[Any]:
    key = ev.key.decode(errors="backslashreplace")
    if ev.event in ("removed", "evicted"):
        return ["BlockUpdateEvent", key, []]
    replicas = [["memory", s] for s in ev.memory] + [["local_disk", c] for c in ev.disk]
    if ev.event == "stored":
        return ["BlockStoreEvent", key, replicas, "", ev.size, block_hash, "", []]
    return ["BlockUpdateEvent", key, replicas]


def batch_payload(events: Iterable[KVEvent], hash_of: Callable[[bytes], str], ts: float) -> bytes:
    import msgpack

    return msgpack.packb([ts, [mooncake_event(ev, hash_of(ev.key)) for ev in events]], use_bin_type=True)


def publish(master, address: str, stop: threading.Event, topic: str = TOPIC, position: Position | None = None,
            interval_s: float = 0.2, on_batch: Callable[[int, int], None] | None = None) -> int:
    """Bind a ZMQ PUB socket at `address` and publish the store's events from `position`
    (None: new ones only) until `stop` is set, one batch per poll that found events. Returns
    the number of batches sent; `on_batch(seq, n_events)` after each."""
    import zmq

    def hash_of(key: bytes) -> str:  # prefix_of gives back the key itself when it has no hash
        found = prefix_of(key, master.key_pattern)
        has_hash = found != key or master.key_pattern.match(key) is not None
        return found.decode(errors="backslashreplace") if has_hash else ""

    context: zmq.Context = zmq.Context.instance()
    sock = context.socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.bind(address)
    seq = 0
    position = position if position is not None else master.events_position_now()
    try:
        while not stop.is_set():
            batch = master.events(position)
            if batch:
                payload = batch_payload(batch, hash_of, time.time())
                sock.send_multipart([topic.encode(), seq.to_bytes(8, "big"), payload])
                if on_batch:
                    on_batch(seq, len(batch))
                seq += 1
            else:
                stop.wait(interval_s)
    finally:
        sock.close()
    return seq
