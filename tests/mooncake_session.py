"""Mooncake's own client (mooncake.store.MooncakeDistributedStore) running a named scenario
against a master address, one JSON line per step on stdout: {"step", "result"}. Run by the
gateway tests in a subprocess, against mooncake_master and against the gateway, so that both
answers can be compared; a segfault of the client (a bad address) fails the test, not pytest.

    python mooncake_session.py SCENARIO MASTER METADATA [SEGMENT_MIB]
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from mooncake.store import MooncakeDistributedStore

MiB = 1 << 20


def emit(step: str, result) -> None:
    if isinstance(result, (bytes, bytearray)):
        result = {"bytes": len(result), "sha256": hashlib.sha256(result).hexdigest()[:16]}
    print(json.dumps({"step": step, "result": result}), flush=True)


def setup(master: str, metadata: str, segment_mib: int) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", metadata, segment_mib * MiB, 16 * MiB, "tcp", "", master)
    emit("setup", rc)
    if rc != 0:
        sys.exit(3)
    return store


def basic(store: MooncakeDistributedStore) -> None:
    """The calls an engine makes, with sizes from 1 B to 8 MiB and a 300-key batch."""
    blobs = {"one-byte": b"x", "one-mib": os.urandom(MiB), "eight-mib": os.urandom(8 * MiB)}
    for key, value in blobs.items():
        emit(f"put {key}", store.put(key, value))
    for key, value in blobs.items():
        got = store.get(key)
        emit(f"get {key} equal", got == value)
    emit("get_size eight-mib", store.get_size("eight-mib"))
    emit("get missing", store.get("missing"))
    emit("is_exist one-byte", store.is_exist("one-byte"))
    emit("is_exist missing", store.is_exist("missing"))
    keys = [f"page-{i:04d}" for i in range(300)]
    emit("put_batch 300", store.put_batch(keys, [k.encode() * 4 for k in keys]))
    emit("batch_is_exist 301", sum(store.batch_is_exist(keys + ["missing"])))
    got = store.get_batch(keys[:50])
    emit("get_batch 50 equal", all(g == k.encode() * 4 for g, k in zip(got, keys)))
    emit("put again (exists)", store.put("one-byte", b"y"))
    from mooncake.store import ReplicateConfig
    same_node = ReplicateConfig()
    same_node.prefer_alloc_in_same_node = True  # the 0.3.13.post1 client refuses it itself (-600) in this setup
    emit("put prefer_alloc_in_same_node", store.put("same-node", b"z" * 64, same_node))
    emit("is_exist same-node", store.is_exist("same-node"))
    emit("remove leased", store.remove("one-byte"))
    emit("remove forced", store.remove("one-byte", True))
    emit("remove missing", store.remove("missing", True))
    emit("is_exist after remove", store.is_exist("one-byte"))
    emit("remove_by_regex", store.remove_by_regex("^page-00[0-4][0-9]$", True))
    emit("batch_is_exist after regex", sum(store.batch_is_exist(keys)))
    emit("batch_remove", store.batch_remove(keys[50:60], True))
    emit("remove_all leased", store.remove_all())
    emit("remove_all forced", store.remove_all(True))
    emit("batch_is_exist after remove_all", sum(store.batch_is_exist(keys + list(blobs))))


def provider(store: MooncakeDistributedStore) -> None:
    """Holds its segment until stdin closes (a consumer writes into it meanwhile)."""
    emit("ready", 0)
    sys.stdin.read()


def consumer(store: MooncakeDistributedStore) -> None:
    """No segment of its own: every byte goes to a provider's segment over TCP."""
    value = os.urandom(256 * 1024)
    emit("put", store.put("from-consumer", value))
    emit("get equal", store.get("from-consumer") == value)
    emit("is_exist", store.is_exist("from-consumer"))
    emit("remove forced", store.remove("from-consumer", True))


def writes(store: MooncakeDistributedStore) -> None:
    """Puts until stdin closes; one line per put (the fault tests count them)."""
    i = 0
    while True:
        value = f"value-{i}".encode() * 64
        rc = store.put(f"w-{i}", value)
        got = store.get(f"w-{i}") if rc == 0 else b""
        emit(f"put {i}", [rc, got == value])
        i += 1
        time.sleep(0.05)  # pacing: one put every 50 ms, not a wait for a deadline


def pressure(store: MooncakeDistributedStore) -> None:
    """Four times the segment in 1 MiB objects: eviction makes room; a get of an evicted object
    fails (b''), and never returns other bytes."""
    values = {f"p-{i:03d}": os.urandom(MiB) for i in range(64)}
    emit("puts failed", sum(store.put(k, v) != 0 for k, v in values.items()))
    outcome = {"equal": 0, "missing": 0, "wrong": 0}
    for key, value in values.items():
        got = store.get(key)
        outcome["equal" if got == value else "missing" if got == b"" else "wrong"] += 1
    emit("gets", outcome)


def graceful(store: MooncakeDistributedStore) -> None:
    """A second segment mounted, written to, then unmounted gracefully: its object stays
    readable while the grace period runs."""
    mounted = store.allocate_and_mount_segment(16 * MiB)
    emit("mount", [mounted["ret"], len(mounted["segment_ids"])])
    segment_ids = list(mounted["segment_ids"])
    value = os.urandom(64 * 1024)
    emit("put", store.put("graceful", value))
    emit("unmount_and_free_segment graceful", store.unmount_and_free_segment(segment_ids, 60))
    emit("get after unmount equal", store.get("graceful") == value)


def upsert(store: MooncakeDistributedStore) -> None:
    """Upserts of the same size, another size, a new key and a batch: every get answers the
    last bytes written."""
    values = {"u": os.urandom(64 * 1024)}
    emit("put", store.put("u", values["u"]))
    for step, key, size in (("same size", "u", 64 * 1024), ("bigger", "u", 256 * 1024), ("smaller", "u", 1024),
                            ("new key", "fresh", 4096)):
        values[key] = os.urandom(size)
        emit(f"upsert {step}", store.upsert(key, values[key]))
        emit(f"get after upsert {step} equal", store.get(key) == values[key])
    batch = {"u": os.urandom(2048), "fresh": os.urandom(4096), "other": os.urandom(100)}
    emit("upsert_batch", store.upsert_batch(list(batch), list(batch.values())))
    emit("get_batch after upsert_batch equal", store.get_batch(list(batch)) == list(batch.values()))
    # Mooncake's master counts 3 or 4 here from run to run (an object an upsert replaced may still
    # be counted): what both must do is remove the three keys
    emit("remove_all forced removes the keys", store.remove_all(True) >= len(batch))
    emit("gone after remove_all", [store.is_exist(k) for k in batch])


def holder(store: MooncakeDistributedStore) -> None:
    """Names its segment, then holds it until stdin closes (a copy task writes into it)."""
    emit("ready", store.get_hostname())
    sys.stdin.read()


def copy(store: MooncakeDistributedStore) -> None:
    """A put into its own segment, a copy task onto the holder's segment (argv[5]), which this
    client's own task thread runs; the task's status, then the object's replicas."""
    from mooncake.store import ReplicateConfig
    config = ReplicateConfig()
    config.preferred_segment = store.get_hostname()
    value = os.urandom(64 * 1024)
    emit("put", store.put("copied", value, config))
    task, rc = store.create_copy_task("copied", [sys.argv[5]])
    emit("create_copy_task", rc)
    status = None
    for _ in range(200):  # the client fetches its tasks once a second
        info, rc = store.query_task(task)
        status = str(info.status) if info is not None else f"error {rc}"
        if "SUCCESS" in status or "FAILED" in status:
            break
        time.sleep(0.1)
    emit("task status", status.rsplit(".", 1)[-1])
    emit("replicas", len(store.get_replica_desc("copied")))
    emit("get equal", store.get("copied") == value)
    emit("remove forced", store.remove("copied", True))


SCENARIOS = {"basic": basic, "holder": holder, "copy": copy, "provider": provider, "consumer": consumer, "writes": writes, "pressure": pressure,
             "graceful": graceful, "upsert": upsert}

if __name__ == "__main__":
    scenario, master, metadata = sys.argv[1:4]
    segment = int(sys.argv[4]) if len(sys.argv) > 4 else 64
    store = setup(master, metadata, 0 if scenario == "consumer" else segment)
    SCENARIOS[scenario](store)
    emit("close", store.close())
