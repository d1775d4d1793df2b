"""What the object layout costs the reads: exist_key's floor (the calls it must make, nothing
else) under callgrind, for the layout the store has and for two it could have. A probe for
choosing a layout, not a figure of the store's own functions (those are `bench instructions`).

* objects: one hash per object, as the store keeps them: the configuration, the clock, one
  HMGET of the read fields per key, one ZADD XX GT of the keys' leases (mcb_floor_exist);
* shard hash: every object of a shard a field of one hash (its value the object's fields,
  joined): one HMGET for all the keys of a call, then the same ZADD;
* shard hash, no lease write: the same without the ZADD, as a read within kv_lease_slack could
  be if the lease it checks came with that HMGET.

A private valkey-server under callgrind (bench/instructions.py's CallgrindValkey), 2,000
complete objects of 64 KiB with one replica on one shard (the shard hash is copied from their
hashes), n calls of one key and n/100 calls of 100 keys; instructions per key, minus an empty
window's, and the redis.calls per key.

    python -m mooncake_redis.bench.layout [--n 200]
"""
from __future__ import annotations

import argparse
import contextlib
from typing import Callable

from mooncake_redis import MasterConfig
from mooncake_redis.keys import ShardKeys

from . import instructions as bi

STORE = 2000
BATCH = 100
OBJECT_FIELDS = (b"size", b"writer", b"reps")  # a complete object's fields

# The two layouts' read floors, beside the bench library's mcb_floor_exist (today's layout).
PROBES = r"""
local function shard_hash_read(P, a, lease)
  redis.call('HMGET', P .. K.config, 'shards', 'default_kv_lease_ttl', 'kv_lease_slack', 'clock', 'mounts')
  local expires = now_of(redis.call('TIME')) + 5000
  local fields = {}
  for i = 1, #a do fields[i] = 'default:' .. a[i] end
  local v = redis.call('HMGET', P .. K.objects_probe, unpack(fields))
  local zadd, reply = { 'XX', 'GT' }, {}
  for i = 1, #a do
    reply[i] = v[i] and 1 or 0
    if lease and v[i] then zadd[#zadd + 1], zadd[#zadd + 2] = expires, 'o:default:' .. a[i] end
  end
  if #zadd > 2 then redis.call('ZADD', P .. K.tier_ordinary, unpack(zadd)) end
  return reply
end
redis.register_function('mcb_probe_shard_hash', function(k, a) return shard_hash_read(k[1], a, true) end)
redis.register_function('mcb_probe_no_lease', function(k, a) return shard_hash_read(k[1], a, false) end)
"""
PROBE_KEY = ":objects_probe"  # the probe's shard hash, beside the store's keys (its suffix is no store key)

LAYOUTS = (("objects", "one hash per object (the store's)", "mcb_floor_exist"),
           ("shard_hash", "one hash per shard", "mcb_probe_shard_hash"),
           ("no_lease", "one hash per shard, no lease write", "mcb_probe_no_lease"))


def library() -> str:
    """The bench library with the probes (K.objects_probe names the probe's hash)."""
    lib = bi.LIBRARY.replace("local K = { ", f"local K = {{ objects_probe = '{PROBE_KEY}', ", 1)
    return lib + PROBES


def probe(n: int = 200, out: Callable[[str], None] = print) -> dict[str, dict[str, dict]]:
    """{layout: {"x1" | "x100": {"instructions": per key, "redis_calls": per key}}}."""
    with contextlib.ExitStack() as stack:
        server, r, m = bi.callgrind_master(stack, MasterConfig(namespace=bi.NAMESPACE, shards=1), "layout")
        m.mount_segment(bi.SEGMENT, bi.SEGMENT_SIZE, bi.CLIENT)
        r.function_load(library(), replace=True)
        sk = ShardKeys(bi.NAMESPACE, 0)
        keys = [f"obj-{i:06d}" for i in range(STORE)]
        bi.put_complete(m, keys, chunk=500)
        pipe = r.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(sk.object("default", key), *OBJECT_FIELDS)
        rows = pipe.execute()
        shard_hash = sk.P + PROBE_KEY.encode()
        for i in range(0, STORE, 500):
            r.hset(shard_hash, mapping={f"default:{k}": b"|".join(v or b"" for v in row)
                                        for k, row in zip(keys[i:i + 500], rows[i:i + 500])})
        seg = bi.SEGMENT
        server.calibrate(r)
        out(f"exist_key's floor by object layout: {STORE:,} objects on one shard, n={n} "
            f"(instructions per key, redis.calls per key)")
        got: dict[str, dict[str, dict]] = {}
        for name, what, fn in LAYOUTS:
            got[name] = {}
            for rows_per_call in (1, BATCH):
                calls = n if rows_per_call == 1 else max(1, n // BATCH)
                lead = (seg,) if fn == "mcb_floor_exist" else ()  # mcb_floor_exist takes the segment first

                def run() -> None:
                    for c in range(calls):
                        at = (c * rows_per_call) % STORE
                        r.fcall(fn, 1, sk.P, *lead, *keys[at:at + rows_per_call])
                run()  # warm: the leases are renewed past the window's, every call the same path
                w = server.window(r, run)
                per = calls * rows_per_call
                got[name][f"x{rows_per_call}"] = {"instructions": w.instructions / per,
                                                  "redis_calls": sum(w.commands.values()) / per}
            x1, xb = got[name]["x1"], got[name][f"x{BATCH}"]
            out(f"  {what:<38}{x1['instructions']:>10,.0f} ({x1['redis_calls']:.2f})   x{BATCH}: "
                f"{xb['instructions']:>8,.0f} ({xb['redis_calls']:.2f}) a key")
        return got


def _cli() -> None:
    p = argparse.ArgumentParser(prog="python -m mooncake_redis.bench.layout", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200, help="calls of one key per figure (default 200)")
    probe(p.parse_args().n)


if __name__ == "__main__":
    _cli()
