"""A Mooncake client process of the gateway soak (tests/gateway_soak.py): the unchanged
`mooncake.store.MooncakeDistributedStore` against a `mooncake-redis gateway`.

    python gateway_soak_client.py ROLE MASTER INDEX OUT_DIR [SEGMENT_MIB]

provider  mounts a segment of SEGMENT_MIB of its memory and holds it until stdin closes (the
          writers' bytes live here: writers hold no memory, so killing one loses nothing stored)
writer    no segment of its own; puts unique keys (single puts and small batches) whose bytes are
          a function of the key, reads each acknowledged single put back, and removes (forced)
          its oldest keys to keep at most MAX_LIVE. It appends one line per outcome to
          OUT_DIR/writer-INDEX.log, always after the reply arrived, so a SIGKILL at any point
          leaves a true log:
            S gen      a new process (generation) of this writer started
            A key      put (or the batch holding it) answered 0: acknowledged
            r key      a remove of the key is about to be sent (outcome unknown until R/N)
            R key      remove answered 0          N key  remove answered OBJECT_NOT_FOUND (lost)
            W key      read back other bytes than were put (never allowed)
          A restarted writer reads its log to carry on with the keys it holds.
reader    gets random keys the writers acknowledged and have not begun to remove, and a key never
          written; a key it misses is read again 3 s later (a miss during a fault is expected:
          the gateway or Valkey is down). Appends a JSON line of counters to
          OUT_DIR/reader-INDEX.log every 50 reads (wrong: bytes that differ from what was put,
          never allowed; missed_twice: [key, monotonic time], which the driver checks at the end).
verify    reads the keys listed in OUT_DIR/verify-keys.txt (one a line) with get_batch and prints
          one JSON line {"equal": n, "missing": [...], "wrong": [...]}.

Errors are return codes (Mooncake's client raises nothing): a put that does not answer 0 is not
acknowledged; the soak's faults (gateway, Valkey, worker kills) make some fail by design."""
from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from pathlib import Path

from mooncake.store import MooncakeDistributedStore

MiB = 1 << 20
MAX_LIVE = 1500            # keys a writer keeps at most (no eviction pressure: far below the segments)
OBJECT_NOT_FOUND = -704


def value_of(key: str) -> bytes:
    """The bytes put under `key`: 1-8 KiB, derived from the key (the verifier needs only keys)."""
    digest = hashlib.sha256(key.encode()).digest()
    size = 1024 + int.from_bytes(digest[:2], "big") % (7 * 1024)
    return (digest * (size // len(digest) + 1))[:size]


def setup(master: str, segment_mib: int) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    for attempt in range(60):  # the gateway may be down for a moment (the soak kills it)
        rc = store.setup("127.0.0.1", "P2PHANDSHAKE", segment_mib * MiB, 16 * MiB, "tcp", "", master)
        if rc == 0:
            return store
        time.sleep(1)  # retrying a failed setup, not waiting for a deadline
        store = MooncakeDistributedStore()
    sys.exit(3)


def provider(store: MooncakeDistributedStore, index: int, out: Path) -> None:
    print("ready", flush=True)
    sys.stdin.read()
    store.close()


def writer(store: MooncakeDistributedStore, index: int, out: Path) -> None:
    path = out / f"writer-{index}.log"
    live: list[str] = []  # acknowledged, not yet removed, oldest first
    gen = 1
    if path.exists():
        state: dict[str, str] = {}
        for line in path.read_text().splitlines():
            tag, _, key = line.partition(" ")
            if tag == "S":
                gen += 1
            elif tag == "A":
                state[key] = "A"
            elif tag in ("r", "R", "N"):
                state.pop(key, None)
        live = list(state)
    log = open(path, "a", buffering=1)
    log.write(f"S {gen}\n")
    rng = random.Random(index * 1000 + gen)
    i = 0
    while True:
        roll = rng.random()
        if len(live) > MAX_LIVE and roll < 0.5:
            key = live.pop(0)
            log.write(f"r {key}\n")
            rc = store.remove(key, True)
            if rc == 0:
                log.write(f"R {key}\n")
            elif rc == OBJECT_NOT_FOUND:
                log.write(f"N {key}\n")
        elif roll < 0.1:
            keys = [f"w{index}-g{gen}-{i + j}" for j in range(4)]
            i += 4
            if store.put_batch(keys, [value_of(k) for k in keys]) == 0:
                log.write("".join(f"A {k}\n" for k in keys))
                live += keys
        else:
            key = f"w{index}-g{gen}-{i}"
            i += 1
            value = value_of(key)
            if store.put(key, value) == 0:
                log.write(f"A {key}\n")
                live.append(key)
                got = store.get(key)
                if got and got != value:
                    log.write(f"W {key}\n")
        time.sleep(0.02)  # pacing: an engine's rate, on a shared 2-core machine


def acknowledged(out: Path) -> list[str]:
    """Keys the writers acknowledged and have not begun to remove."""
    state: dict[str, bool] = {}
    for path in out.glob("writer-*.log"):
        for line in path.read_text().splitlines():
            tag, _, key = line.partition(" ")
            if tag == "A":
                state[key] = True
            elif tag == "r":
                state[key] = False
    return [k for k, ok in state.items() if ok]


def reader(store: MooncakeDistributedStore, index: int, out: Path) -> None:
    rng = random.Random(index)
    counts = {"reads": 0, "equal": 0, "miss": 0, "wrong": 0, "absent_ok": 0, "absent_bad": 0,
              "miss_then_read": 0, "miss_twice": 0}
    wrong: list[str] = []
    keys: list[str] = []
    recheck: list[tuple[float, str]] = []  # keys a read missed, read again 3 s later
    missed_twice: list[list] = []  # [key, time.monotonic() of the second miss]: the driver judges them
    refreshed = 0.0
    log = open(out / f"reader-{index}.log", "a", buffering=1)
    while True:
        if time.monotonic() - refreshed > 2:
            keys, refreshed = acknowledged(out), time.monotonic()
        if recheck and recheck[0][0] < time.monotonic():
            _, key = recheck.pop(0)
            if key in set(keys):  # no remove of it began meanwhile
                got = store.get(key)
                counts["miss_then_read" if got == value_of(key) else "miss_twice"] += 1
                if got != value_of(key):
                    missed_twice.append([key, round(time.monotonic(), 1)])
        if keys:
            key = rng.choice(keys)
            got = store.get(key)
            counts["reads"] += 1
            if got == value_of(key):
                counts["equal"] += 1
            elif got:
                counts["wrong"] += 1
                wrong.append(key)
            else:
                counts["miss"] += 1  # a fault (a gateway or Valkey down), or a remove begun since
                recheck.append((time.monotonic() + 3, key))
        got = store.get(f"never-written-{rng.random()}")
        counts["absent_ok" if not got else "absent_bad"] += 1
        if counts["reads"] % 50 == 0:
            log.write(json.dumps({**counts, "wrong_keys": wrong[:20], "missed_twice": missed_twice}) + "\n")
        time.sleep(0.02)


def verify(store: MooncakeDistributedStore, index: int, out: Path) -> None:
    keys = (out / "verify-keys.txt").read_text().split()
    equal, missing, wrong = 0, [], []
    for at in range(0, len(keys), 50):
        part = keys[at:at + 50]
        got_batch = store.get_batch(part)
        for key, got in zip(part, got_batch):
            if not got:
                got = store.get(key)  # one by one: a batch may fail as a whole
            if got == value_of(key):
                equal += 1
            elif got:
                wrong.append(key)
            else:
                missing.append(key)
    print(json.dumps({"equal": equal, "missing": missing, "wrong": wrong}), flush=True)
    store.close()


ROLES = {"provider": provider, "writer": writer, "reader": reader, "verify": verify}

if __name__ == "__main__":
    role, master, index, out_dir = sys.argv[1:5]
    segment_mib = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    ROLES[role](setup(master, segment_mib), int(index), Path(out_dir))
