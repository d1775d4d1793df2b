"""Moved: the lean RESP path is mooncake_redis.transport.resp."""
from .transport.resp import LEAN_COMMANDS, LeanClient, close, lean_for, pack

__all__ = ["LEAN_COMMANDS", "LeanClient", "close", "lean_for", "pack"]
