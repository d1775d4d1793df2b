"""Group retention figures for `bench ops` (bench/ops.py runs them after its own):

* retain_groups of 100 groups a call (groups/s), each call admitting 100 new groups;
* the cost of an eviction step (mc_evict, EVICT_STEP_UNITS units) on a store whose objects are
  10% members of retained groups, side by side with the same store without retention, in the
  same run (each repeat fills both stores and evicts both down to their target, alternating
  which goes first); wall time per step and the server's (INFO commandstats of FCALL).

Each store is its own namespace "bench.ev<case>-<repeat>" on the same server (bench/ops.py
deletes every bench.* key before and after a run)."""
from __future__ import annotations

import statistics
import time

import redis

from mooncake_redis import Master, MasterConfig, ReplicateConfig

from .common import WIDE_WATERMARKS

OBJECTS = 20_000          # objects per eviction store
OBJ = 1000                # bytes each
GROUP = 10                # members per group
RETAINED = 0.10           # share of the objects in retained groups
HOUR = 3_600_000
CHUNK = 500
EVICT_REPEATS = 5         # the step figures vary most on a shared machine: median of 5



def _fcall_usec(r: redis.Redis) -> tuple[int, int]:
    stats = r.info("commandstats").get("cmdstat_fcall", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def _fill(m: Master, retained: float) -> None:
    """OBJECTS objects on a segment sized so they fill 99% of it; `retained` of them in groups
    of GROUP members, retained for an hour; every lease then runs out."""
    m.freeze_clock(1_700_000_000_000)
    m.mount_segment("seg", int(OBJECTS * OBJ / 0.99), "bench")
    n_groups = int(OBJECTS * retained) // GROUP
    keys = [f"o{i:06d}" for i in range(OBJECTS - n_groups * GROUP)]
    for i in range(0, len(keys), CHUNK):
        m.batch_put_start("bench", keys[i:i + CHUNK], [OBJ] * len(keys[i:i + CHUNK]))
        m.batch_put_end("bench", keys[i:i + CHUNK])
    groups = [f"g{i:05d}" for i in range(n_groups)]
    for g in groups:
        members = [f"{{{g}}}/{j}" for j in range(GROUP)]
        m.batch_put_start("bench", members, [OBJ] * GROUP, ReplicateConfig(group_id=g))
        m.batch_put_end("bench", members)
    if groups:
        m.retain_groups(groups, HOUR)
    m.advance_clock(m.config.default_kv_lease_ttl + 1)


def _evict_all(m: Master, r: redis.Redis) -> tuple[float, float, int]:
    """Evict down to the target in steps: (wall us per step, server us per step, steps)."""
    steps = 0
    c0, u0 = _fcall_usec(r)
    t0 = time.perf_counter()
    while True:
        step = m.evict_step(0)
        steps += 1
        if step.state != "more":
            break
    wall = time.perf_counter() - t0
    c1, u1 = _fcall_usec(r)
    return wall * 1e6 / steps, (u1 - u0) / max(c1 - c0, 1), steps


def figures(url: str, r: redis.Redis, repeats: int, out) -> dict:
    res: dict = {}
    # retain_groups, 100 new groups a call
    m = Master.connect(url, MasterConfig(namespace="bench.retain", max_retained_groups=1 << 20))
    try:
        rates = []
        calls = 50
        for rep in range(repeats):
            batches = [[f"r{rep}-{c}-{i}" for i in range(100)] for c in range(calls)]
            t0 = time.perf_counter()
            for b in batches:
                got = m.retain_groups(b, HOUR)
                assert all(x > 0 for x in got), got
            rates.append(calls * 100 / (time.perf_counter() - t0))
    finally:
        m.close()
    res["retain_groups_x100_groups_per_s"] = statistics.median(rates)
    out(f"{'retain_groups x100':<22}{res['retain_groups_x100_groups_per_s']:>10,.0f} groups/s   "
        f"({calls} calls of 100 new groups per repeat, median of {repeats})")
    # eviction step cost: 10% of the objects in retained groups vs none
    per: dict[str, list] = {"none": [], "retained": []}
    cases = [("none", 0.0), ("retained", RETAINED)]
    for rep in range(EVICT_REPEATS):
        for case, share in (cases if rep % 2 == 0 else cases[::-1]):  # alternate which goes first
            m = Master.connect(url, MasterConfig(namespace=f"bench.ev{case}-{rep}", **WIDE_WATERMARKS))
            try:
                _fill(m, share)
                per[case].append(_evict_all(m, r))
            finally:
                m.close()
    for case in per:
        wall = statistics.median(x[0] for x in per[case])
        srv = statistics.median(x[1] for x in per[case])
        res[f"evict_step_{case}_us"], res[f"evict_step_{case}_server_us"] = wall, srv
        res[f"evict_steps_{case}"] = per[case][0][2]
    res["evict_step_retained_ratio"] = res["evict_step_retained_us"] / res["evict_step_none_us"]
    res["evict_step_retained_server_ratio"] = res["evict_step_retained_server_us"] / res["evict_step_none_server_us"]
    out(f"{'evict step, no retention':<26}{res['evict_step_none_us']:>8,.1f} us/step   server "
        f"{res['evict_step_none_server_us']:.1f} us/step ({res['evict_steps_none']} steps of 16 units, "
        f"{OBJECTS:,} objects at 99% down to the target; median of {EVICT_REPEATS})")
    out(f"{'evict step, 10% retained':<26}{res['evict_step_retained_us']:>8,.1f} us/step   server "
        f"{res['evict_step_retained_server_us']:.1f} us/step   vs no retention {res['evict_step_retained_ratio']:.2f} "
        f"(server {res['evict_step_retained_server_ratio']:.2f}; target within 1.2)")
    return res
