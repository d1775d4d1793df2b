"""The gateway soak (tests/gateway_soak.py) as an opt-in test: Mooncake's own client through
`mooncake-redis gateway` processes while workers, gateways, writers and Valkey are killed and
restarted; every acknowledged put must read back byte for byte and fsck must be clean.

    MOONCAKE_SOAK=1 MOONCAKE_SOAK_SECONDS=600 python -m pytest -q -s -n 0 tests/test_gateway_soak.py

(default 90 s of faults; the standalone driver: python tests/gateway_soak.py --seconds 600)."""
from __future__ import annotations

import os

import pytest

from mooncake_redis.bench.mooncake import MooncakeUnavailable, find_mooncake

try:
    find_mooncake()
    UNAVAILABLE = ""
except MooncakeUnavailable as exc:
    UNAVAILABLE = str(exc)

SECONDS = float(os.environ.get("MOONCAKE_SOAK_SECONDS", "90"))

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("MOONCAKE_SOAK") != "1",
                                 reason="soak test: set MOONCAKE_SOAK=1 (and MOONCAKE_SOAK_SECONDS)"),
              pytest.mark.skipif(bool(UNAVAILABLE), reason=UNAVAILABLE or "-")]


@pytest.mark.timeout(SECONDS + 900)
def test_gateway_soak(tmp_path):
    from gateway_soak import run

    summary = run(SECONDS, tmp_path)
    assert summary["writer_log"].get("A", 0) > 100, "the writers acknowledged almost nothing"
    assert summary["read_back_equal"] == summary["acknowledged_kept"]
    assert not summary["problems"], "\n".join(summary["problems"])
