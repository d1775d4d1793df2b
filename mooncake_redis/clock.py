"""The store clock's test hook: every function reads the `clock` field of `<P>:config` (absolute
ms) when it is set, else the server's TIME; tests freeze and advance it instead of sleeping."""
from __future__ import annotations

from .api import ApiBase
from .checks import _check_int
from .errors import ErrorCode, MasterError
from .keys import CLOCK_FIELD


class ClockApi(ApiBase):
    def now_ms(self) -> int:
        return int(self.transport.call("mc_now", 0))

    def freeze_clock(self, now_ms: int) -> None:
        """Make every shard's functions read `now_ms` instead of the server's TIME."""
        _check_int(now_ms, "now_ms", 0)
        self.transport.run([("HSET", k.config, CLOCK_FIELD, now_ms) for k in self.transport.keys])

    def advance_clock(self, delta_ms: int) -> int:
        _check_int(delta_ms, "delta_ms", 0)
        if self.transport.run([("HGET", self.transport.keys[0].config, CLOCK_FIELD)])[0] is None:
            raise MasterError(ErrorCode.INVALID_PARAMS, "the clock is not frozen")
        return int(self.transport.run([("HINCRBY", k.config, CLOCK_FIELD, delta_ms) for k in self.transport.keys])[0])

    def unfreeze_clock(self) -> None:
        self.transport.run([("HDEL", k.config, CLOCK_FIELD) for k in self.transport.keys])  # one slot per command
