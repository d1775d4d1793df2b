"""The wire format of the engine-facing functions (parse_call in lua/lib/00_base.lua):

    ARGV = n_opts, (name, value) x n_opts [, n_fields, field name x n_fields, rows...]

Options are named, so a field added later (a guarantee TTL, a prefix or parent hash) never
breaks a caller written for the previous protocol; each row carries the declared fields in the
declared order. An option whose value is None is left out (the function's default applies)."""
from __future__ import annotations

from typing import Any, Sequence

DEFAULT_TENANT = "default"  # the tenant of a call without the tenant option (object_call, put_start)


def options(**opts: Any) -> list[Any]:
    """[n_opts, name, value, ...]; a list value repeats the option (e.g. preferred segments)."""
    flat: list[Any] = []
    for name, value in opts.items():
        if name == "tenant" and value == DEFAULT_TENANT:
            continue  # the functions' default: two strings less for the server to make, every call
        for v in (value if isinstance(value, (list, tuple)) else [value]):
            if v is not None:
                flat += [name, v]
    return [len(flat) // 2, *flat]


def head(fields: Sequence[str], **opts: Any) -> list[Any]:
    """The ARGV before the rows of a per-key call: options, then the declared fields."""
    return [*options(**opts), len(fields), *fields]


KEY = ("key",)
KEY_SIZE = ("key", "size")
KEY_SIZE_PREFIX = ("key", "size", "prefix")
PREFIX = ("prefix",)
