"""A writer process for test_chaos: random puts, reads and removes against a shared store.
Usage: python chaos_writer.py URL SEED OPS. Prints "half" after half its operations."""
import random
import sys

from mooncake_redis import Master, MasterError

url, seed, ops = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
m = Master.connect(url)
client = f"writer-{seed}"
for i in range(ops):
    key = f"w{rng.randrange(400)}"
    op = rng.random()
    try:
        if op < 0.6:
            m.put_start(client, key, rng.randrange(1, 9) * 1024)
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
