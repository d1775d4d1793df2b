"""A writer process for test_chaos: random puts, reads and removes against a shared store.
Usage: python chaos_writer.py URL SEED OPS [radix]. Prints "half" after half its operations.
With `radix`, keys are <hash of node n>_<j> and each put names node (n - 1) // 2 as its parent
(a binary tree of 200 nodes)."""
import hashlib
import random
import sys

from mooncake_redis import Master, MasterError, ReplicateConfig

url, seed, ops = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
radix = sys.argv[4:] == ["radix"]


def node(n: int) -> str:
    return hashlib.sha256(f"chaos-node-{n}".encode()).hexdigest()



rng = random.Random(seed)
m = Master.connect(url)
client = f"writer-{seed}"
for i in range(ops):
    n = rng.randrange(200)
    key = f"{node(n)}_{rng.randrange(2)}" if radix else f"w{rng.randrange(400)}"
    config = ReplicateConfig(parent_block_hash=node((n - 1) // 2) if n else None) if radix else None
    op = rng.random()
    try:
        if op < 0.6:
            m.put_start(client, key, rng.randrange(1, 9) * 1024, config)
            m.put_end(client, key)
        elif op < 0.85:
            m.get_replica_list(key)
        else:
            m.remove(key)
    except MasterError:
        pass  # already exists, no space, not found, leased, another writer's put: all expected
    if i == ops // 2:
        print("half", flush=True)
print("done", flush=True)
