"""Argument checks shared by the API families: a bad argument is MasterError(INVALID_PARAMS)
raised before anything is sent."""
from __future__ import annotations

from typing import Any

from .config import NAME_RE
from .errors import ErrorCode, MasterError


def _utf8(value: str, what: str) -> bytes:
    try:
        return value.encode()
    except UnicodeEncodeError:  # a lone surrogate: not text, so not sendable as a str
        raise MasterError(ErrorCode.INVALID_PARAMS, f"{what} is not valid Unicode text (pass bytes)") from None


def _as_key(key: Any) -> bytes:
    if isinstance(key, str):
        return _utf8(key, "key")
    if isinstance(key, (bytes, bytearray)):
        return bytes(key)
    raise MasterError(ErrorCode.INVALID_PARAMS, f"key must be str or bytes, not {type(key).__name__}")


def _as_keys(values: Any, what: str = "keys") -> list[bytes]:
    """A list of keys (str or bytes each); a str or bytes itself is refused, not taken as its
    characters."""
    if isinstance(values, (str, bytes, bytearray)) or not hasattr(values, "__iter__"):
        raise MasterError(ErrorCode.INVALID_PARAMS, f"{what} must be a list, not {type(values).__name__}")
    return [_as_key(v) for v in values]


SHOWN_KEY_BYTES = 64  # a key in a message: at most this many bytes of it


def _shown_key(key: bytes) -> str:
    """A key for a message: its first SHOWN_KEY_BYTES bytes (and its length when longer)."""
    if len(key) <= SHOWN_KEY_BYTES:
        return repr(key.decode(errors="backslashreplace"))
    return f"{key[:SHOWN_KEY_BYTES].decode(errors='backslashreplace')!r}... ({len(key):,} bytes)"


def _check_tenant(tenant_id: Any) -> str:
    if not isinstance(tenant_id, str) or not NAME_RE.fullmatch(tenant_id):
        raise MasterError(ErrorCode.INVALID_PARAMS, "tenant_id must match [A-Za-z0-9_.-]{1,64}")
    return tenant_id


def _check_name(value: Any, what: str, max_len: int = 256) -> str:
    if not isinstance(value, str) or not 1 <= len(_utf8(value, what)) <= max_len:
        raise MasterError(ErrorCode.INVALID_PARAMS, f"{what} must be a non-empty string of at most {max_len} bytes")
    return value


def _check_bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise MasterError(ErrorCode.INVALID_PARAMS, f"{what} must be a bool, not {type(value).__name__}")
    return value


def _check_int(value: Any, what: str, lo: int, hi: int = 2**53 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise MasterError(ErrorCode.INVALID_PARAMS, f"{what} must be an integer in [{lo}, {hi}]")
    return value


def _code(value: Any) -> ErrorCode | None:
    """A per-key reply that is an integer is an error code (0 = OK)."""
    return ErrorCode(value) if isinstance(value, int) else None
