"""Builds the Redis Functions library from lua/ and loads it when the server's copy differs."""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

import redis

LIBRARY_NAME = "mooncake"
LUA_DIR = Path(__file__).resolve().parent.parent / "lua"


@lru_cache(maxsize=1)
def library_source() -> tuple[str, str]:
    """(source, version). Shared helpers (lua/lib) come first; each operation file (lua/ops)
    is wrapped in do ... end so its locals stay its own."""
    parts = [p.read_text() for p in sorted((LUA_DIR / "lib").glob("*.lua"))]
    parts += ["do\n" + p.read_text() + "\nend" for p in sorted((LUA_DIR / "ops").glob("*.lua"))]
    body = "\n".join(parts)
    version = hashlib.sha1(body.encode()).hexdigest()[:16]
    source = f"#!lua name={LIBRARY_NAME}\nlocal LIBRARY_VERSION = '{version}'\n{body}"
    return source, version


def ensure_loaded(client: redis.Redis, force: bool = False) -> str:
    """Load the library unless the server already runs this exact version."""
    source, version = library_source()
    if not force:
        try:
            current = client.execute_command("FCALL_RO", "mc_version", 0)
            if (current.decode() if isinstance(current, bytes) else current) == version:
                return version
        except redis.ResponseError:
            pass
    client.execute_command("FUNCTION", "LOAD", "REPLACE", source)
    return version
