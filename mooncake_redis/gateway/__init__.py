"""The Mooncake wire gateway: Mooncake's master protocol (coro_rpc, struct_pack) served from mooncake-redis."""
