"""Bringing a store of an older layout (its `schema_version`, library.SCHEMA_VERSION) to this
package's: Master.connect runs it before it records the new version.

Schema 2 keeps an object's memory replicas in one field (`reps`, mooncake_redis.layout); schema 3
marks an object that has (or had) a guarantee, hard pin, task reference, soft pin or disk replica
(`special`: such an object takes the general read); in schema 4 a complete object has no
`status` field (only a put in progress has one); in schema 5 a radix node's key set holds its
keys with the node's hash taken out (an older store's entries are listed again in that form); in
schema 6 a radix key's `node` field says where the node's hash sits in the key
(`=<n>:<length>`); in schema 7 a radix node's keys are fields of its record (each object's
moves out of the node's set, which goes with its last); in schema 8 a radix node may list a
child in its record (`kid`, `kid_seq`: the first child the call that created it linked), which
needs no rewrite (a store of schema 7 skips the object pass); in schema 9 a shard keeps no index
of its radix nodes (`P:rnodes`: the reconciliation and status walks SCAN the node records), so
the upgrade empties it (`drop_node_index`). `mc_upgrade_objects` rewrites
older objects, which stay readable meanwhile (a node's set is read beside its record until
then), so the upgrade needs no pause of the engines."""
from __future__ import annotations

import logging
from typing import Any

from .library import SCHEMA_FIELD

log = logging.getLogger(__name__)

BATCH = 256  # object ids a call (the function takes at most 512)
NODE_INDEX = b":rnodes"  # schema 8's index of a shard's radix nodes (a zset), after the shard key
NODE_INDEX_GONE = 9  # the schema without it


def stored_schema(stored: dict) -> int:
    """The schema of a store from its shard 0 config hash (a store without the field is schema 1)."""
    raw = stored.get(SCHEMA_FIELD.encode())
    return int(raw) if raw is not None else 1


def upgrade_objects(transport: Any) -> int:
    """Rewrite every object of an older layout, shard by shard, in bounded calls; returns how many
    were rewritten."""
    done = 0
    for shard in range(transport.count):
        for tenant, keys in transport.scan_objects(shard):
            ids = [tenant.encode() + b":" + key for key in keys]
            for i in range(0, len(ids), BATCH):
                done += int(transport.call("mc_upgrade_objects", shard, *ids[i:i + BATCH]))
        log.info("upgrade: shard %d of %d done, %d objects rewritten so far", shard + 1, transport.count, done)
    return done


def drop_node_index(transport: Any) -> int:
    """Empty each shard's schema-8 node index in bounded steps (a ZREM of BATCH members at a
    time, so no one command holds the server for the whole set); returns the entries removed."""
    done = 0
    for shard in range(transport.count):
        key = transport.keys[shard].P + NODE_INDEX
        while members := transport.run([("ZRANGE", key, 0, BATCH - 1)])[0]:
            done += int(transport.run([("ZREM", key, *members)])[0])
    if done:
        log.info("upgrade: %d entries of the radix node index removed", done)
    return done
