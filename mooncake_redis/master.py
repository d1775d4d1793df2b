"""Master: the typed client. Every state change is one FCALL of the `mooncake` library
(batches: one FCALL per shard, pipelined); Python keeps no state of its own.

The API is split by family (see mooncake_redis.api: objects, segments, maintenance, clock), each
a mixin over the one shard transport (`Master.transport`, mooncake_redis.transport.Shards) that
Worker, fsck and the CLI share too."""
from __future__ import annotations

import dataclasses

import redis

from .checks import _check_bool
from .clock import ClockApi
from .config import MasterConfig
from .errors import ErrorCode, MasterError
from .events import EventsApi
from .groups import GroupsApi
from .keys import HELD_DUE_FIELD, ShardKeys, compile_key_pattern
from .library import OBJECTS_SCHEMA, check_schema, load, stored_config
from .maintenance import EVICT_STEP_UNITS, MaintenanceApi
from .objects import ObjectsApi
from .offload import OffloadApi
from .preflight import check_server
from .queries import QueriesApi
from .radix import RadixApi
from .replication import ReplicationApi
from .segments import SegmentsApi
from .task_queue import TaskQueueApi
from .transport import CONNECT_TIMEOUT_S, SOCKET_TIMEOUT_S, Shards, client_from_url, run
from .upgrade import NODE_INDEX_GONE, drop_node_index, stored_schema, upgrade_objects
from .upsert import UpsertApi

__all__ = ["Master", "EVICT_STEP_UNITS"]  # EVICT_STEP_UNITS: the default of evict_step and the worker

# master.client_from_url (cli/, bench/) and its old name _redis_from_url: transport.client_from_url
_redis_from_url = client_from_url


class Master(ObjectsApi, SegmentsApi, MaintenanceApi, ClockApi, GroupsApi, OffloadApi, RadixApi, EventsApi, QueriesApi,
             UpsertApi, ReplicationApi, TaskQueueApi):
    def __init__(self, client: redis.Redis, config: MasterConfig):
        self.redis = client
        self.config = config
        self.ns = config.namespace
        self.shards = config.shards
        self.key_pattern = compile_key_pattern(config.radix_key_pattern)
        self.malformed_seen: dict[str, str] = {}
        self.read_heads: dict[tuple[str, str], list] = {}
        wait = (config.min_replicas_ack, config.replica_ack_timeout) if config.min_replicas_ack else None
        self.transport = Shards(client, self.ns, self.shards, wait, self.key_pattern)

    # ---- connection -------------------------------------------------------------------
    @classmethod
    def connect(cls, url: str = "memory://", config: MasterConfig | None = None, *,
                socket_timeout: float | None = SOCKET_TIMEOUT_S,
                connect_timeout: float | None = CONNECT_TIMEOUT_S, require_noeviction: bool = True) -> "Master":
        """Connect, load the functions if needed, and make sure the store has a configuration:
        an explicit `config` is written to every shard; with none, the stored one is used
        (or the defaults, on a new store). `socket_timeout` bounds the wait for each reply and
        `connect_timeout` the opening of a connection (seconds; None waits forever); a call
        that gets no reply raises OUTCOME_UNKNOWN.

        On a real server it first checks (mooncake_redis.preflight) that maxmemory-policy is
        noeviction (require_noeviction=False accepts another, for operators who know no store
        key can be evicted) and, with ACLs, that the user may run every command needed on the
        namespace's keys."""
        if config is not None and not isinstance(config, MasterConfig):
            raise MasterError(ErrorCode.INVALID_PARAMS, "config must be a MasterConfig")
        _check_bool(require_noeviction, "require_noeviction")
        client = client_from_url(url, socket_timeout, connect_timeout)
        try:
            if not url.startswith("memory://"):
                check_server(client, config.namespace if config else MasterConfig.namespace, require_noeviction)
            return cls._open(client, config)
        except BaseException:
            client.close()
            raise

    @classmethod
    def _open(cls, client: redis.Redis, config: MasterConfig | None) -> "Master":
        namespace = config.namespace if config else MasterConfig.namespace
        stored = run(client, [("HGETALL", ShardKeys(namespace, 0).config)])[0]
        check_schema(namespace, stored)
        current = MasterConfig.from_redis(namespace, stored) if stored else None
        if config is not None and current and not config.pattern_chosen:  # the store's own pattern, kept
            config = dataclasses.replace(config, key_profile="", radix_key_pattern=current.radix_key_pattern)
        if config is None:
            config = current or MasterConfig()
        elif current and current.shards != config.shards:
            raise MasterError(ErrorCode.INVALID_PARAMS,
                              f"store {namespace!r} has {current.shards} shards, config says {config.shards}")
        elif current and current.shards > 1 and current.radix_key_pattern != config.radix_key_pattern:
            raise MasterError(ErrorCode.INVALID_PARAMS,  # the pattern routes keys: its keys would move
                              f"store {namespace!r} routes keys by radix_key_pattern {current.radix_key_pattern!r} "
                              f"(key_profile {current.key_profile!r}), config says {config.radix_key_pattern!r} "
                              f"({config.key_profile!r}): the pattern of a store of several shards cannot change; "
                              f"connect with the store's key_profile, or without a config")
        load(client)
        master = cls(client, config)
        if stored and stored_schema(stored) < OBJECTS_SCHEMA:  # older objects first, then the new version
            upgrade_objects(master.transport)
        if stored and stored_schema(stored) < NODE_INDEX_GONE:
            drop_node_index(master.transport)
        wanted = {k.encode(): v.encode() for k, v in stored_config(config).items()}
        if any(stored.get(k) != v for k, v in wanted.items()):  # new store, new settings or new fields
            master._write_config(new_store=not stored)
        return master

    def _write_config(self, new_store: bool = False) -> None:
        fields = [x for kv in stored_config(self.config).items() for x in kv]
        if new_store:  # nothing is held yet (an older store learns its bound at its next sweep)
            fields += [HELD_DUE_FIELD, "none"]
        self.transport.run([("HSET", k.config, *fields) for k in self.transport.keys])

    def close(self) -> None:
        self.transport.close()
