"""Moved: the cluster path is mooncake_redis.transport.cluster."""
from .transport.cluster import (
                                CLUSTER_SCHEME,
                                cluster_from_url,
                                command_key,
                                is_cluster,
                                is_cluster_url,
                                node_client,
                                node_name,
                                primary_clients,
                                send,
                                send_plain,
                                slot_of,
)

__all__ = ["CLUSTER_SCHEME", "cluster_from_url", "command_key", "is_cluster", "is_cluster_url", "node_client",
           "node_name", "primary_clients", "send", "send_plain", "slot_of"]
