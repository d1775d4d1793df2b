"""The gateway's state in the store (lua/ops/gateway.lua): segment facts by UUID, the transfer
engine's HTTP metadata, clients without a segment, the gateways serving. Everything goes
through the Master's transport, so a gateway holds nothing a restart could lose."""
from __future__ import annotations

from dataclasses import dataclass

from .. import wire
from ..checks import _check_int, _check_name
from ..master import Master
from ..steps import Steps

REAP_BATCH = 64  # recorded segments one mc_gw_reap call looks at
FACT_FIELDS = ("uuid", "client", "endpoint", "protocol", "base", "size")  # of P:gwseg:<name>


@dataclass(frozen=True)
class SegmentFacts:
    """What a gateway recorded when it mounted a segment."""
    name: str
    uuid: str
    client: str
    endpoint: str
    protocol: str
    base: int
    size: int

    def holds(self, address: int, size: int) -> bool:
        """Does [address, address + size) lie inside the segment?"""
        return self.base <= address and address + size <= self.base + self.size


def host_without_port(endpoint: str) -> str:
    """Mooncake's getHostNameWithoutPort: "[v6]:port" -> "v6", "host:port" -> "host", else as is."""
    if endpoint.startswith("[") and "]" in endpoint:
        return endpoint[1:endpoint.index("]")]
    return endpoint.rpartition(":")[0] if ":" in endpoint else endpoint


class GatewayStore:
    def __init__(self, master: Master):
        self.master = master
        self.transport = master.transport
        self.keys0 = master.transport.keys[0]

    # ---- segments ----------------------------------------------------------------------
    def record_segment(self, facts: SegmentFacts) -> None:
        self.transport.call("mc_gw_segment_record", 0, *wire.options(
            uuid=facts.uuid, name=facts.name, client_id=facts.client, endpoint=facts.endpoint,
            protocol=facts.protocol, base=facts.base, size=facts.size))

    def forget_segment(self, name: str) -> bool:
        return self.transport.call("mc_gw_segment_forget", 0, *wire.options(name=name)) == 1

    def segment_name(self, uuid: str) -> str | None:
        """The name of the segment mounted under `uuid`, or None."""
        name = self.transport.run([("HGET", self.keys0.gw_segment_ids, uuid)])[0]
        return name.decode(errors="surrogateescape") if name is not None else None

    def segment_facts(self, name: str) -> SegmentFacts | None:
        return self.master.drive(self.segment_facts_steps([name]))[0]

    def segment_facts_steps(self, names: list[str]) -> Steps[list[SegmentFacts | None]]:
        """The recorded facts of each segment (None: not recorded), in one round trip."""
        rows = yield [("HMGET", self.keys0.gw_segment(name), *FACT_FIELDS) for name in names]
        out: list[SegmentFacts | None] = []
        for name, row in zip(names, rows):
            if row[0] is None:
                out.append(None)
                continue
            uuid, client, endpoint, protocol, base, size = (v.decode(errors="surrogateescape") for v in row)
            out.append(SegmentFacts(name, uuid, client, endpoint, protocol, int(base), int(size)))
        return out

    def client_hosts(self, client_ids: list[str]) -> dict[str, list[str]]:
        """Each asked client that has a mounted segment -> the hosts of its segments' transfer
        endpoints (unique, in segment order; [] when none was recorded), as Mooncake's QueryIp.
        Reads shard 0's segment list (every segment has a slice on every shard) in two round
        trips; a client with no segment is left out."""
        return self.master.drive(self.client_hosts_steps(client_ids))

    def client_hosts_steps(self, client_ids: list[str]) -> Steps[dict[str, list[str]]]:
        wanted = set(client_ids)
        k = self.keys0
        names = (yield [("ZRANGE", k.segments, 0, -1)])[0]
        rows = (yield [cmd for n in names for cmd in (("HGET", k.segment(n), "client"),
                                                      ("HGET", k.gw_segment(n), "endpoint"))]) if names else []
        out: dict[str, list[str]] = {}
        for at in range(0, len(rows), 2):
            client = rows[at].decode(errors="surrogateescape") if rows[at] is not None else None
            if client not in wanted:
                continue
            hosts = out.setdefault(client, [])
            endpoint = rows[at + 1]
            if endpoint:
                host = host_without_port(endpoint.decode(errors="surrogateescape"))
                if host not in hosts:
                    hosts.append(host)
        return out

    def reap(self) -> int:
        """Forget up to REAP_BATCH segments that are no longer mounted, with their metadata."""
        return self.transport.call("mc_gw_reap", 0, REAP_BATCH)

    # ---- clients without a segment -----------------------------------------------------
    def register_client(self, client_id: str) -> None:
        _check_name(client_id, "client_id")
        self.transport.each("mc_gw_register_client", *wire.options(client_id=client_id))

    # ---- the transfer engine's metadata ------------------------------------------------
    def metadata_get(self, key: bytes) -> bytes | None:
        return self.transport.run([("HGET", self.keys0.gw_metadata, key)])[0]

    def metadata_put(self, key: bytes, value: bytes) -> str:
        """'updated', 'unchanged' or 'duplicate' (see mc_gw_metadata_put)."""
        reply = self.transport.call("mc_gw_metadata_put", 0, *wire.options(key=key, value=value))
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    def metadata_delete(self, key: bytes) -> bool:
        return self.transport.call("mc_gw_metadata_delete", 0, *wire.options(key=key)) == 1

    # ---- gateways ----------------------------------------------------------------------
    def heartbeat(self, gateway_id: str, rpc: str, metadata: str, ttl_ms: int, reads: int = 0,
                  read_hits: int = 0) -> None:
        """Announce a serving gateway until now + ttl_ms (0: it leaves), adding the reads it
        served since its last heartbeat (and those answered) to the store's counters."""
        _check_int(ttl_ms, "ttl_ms", 0, 3_600_000)
        _check_int(reads, "reads", 0)
        _check_int(read_hits, "read_hits", 0, reads)
        self.transport.call("mc_gw_heartbeat", 0, *wire.options(id=gateway_id, rpc=rpc, metadata=metadata,
                                                                ttl_ms=ttl_ms, reads=reads or None,
                                                                read_hits=read_hits or None))

    def gateways(self) -> list[dict[str, str]]:
        """The gateways whose heartbeat deadline has not passed (on the store clock)."""
        now = self.master.now_ms()
        ids = self.transport.run([("ZRANGEBYSCORE", self.keys0.gateways, now, "+inf")])[0]
        rows = self.transport.run([("HGETALL", self.keys0.gateway(gid)) for gid in ids]) if ids else []
        return [{"id": gid.decode(errors="replace"), "rpc": row.get(b"rpc", b"").decode(errors="replace"),
                 "metadata": row.get(b"metadata", b"").decode(errors="replace")}
                for gid, row in zip(ids, rows) if row]
