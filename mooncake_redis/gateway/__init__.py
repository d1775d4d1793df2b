"""The Mooncake wire gateway: Mooncake's master protocol (coro_rpc framing, struct_pack bodies) in front of mooncake-redis."""
