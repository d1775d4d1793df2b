"""mooncake-redis: a KV-cache metadata master whose whole state lives in Redis/Valkey."""
from .config import MasterConfig, ReplicateConfig, SoftPinAction
from .errors import ErrorCode, MasterError
from .master import Master
from .models import ObjectInfo, Replica, ReplicaListResult, ReplicaStatus, Usage

__all__ = ["Master", "MasterConfig", "ReplicateConfig", "SoftPinAction", "ErrorCode", "MasterError",
           "Replica", "ReplicaListResult", "ReplicaStatus", "ObjectInfo", "Usage"]
