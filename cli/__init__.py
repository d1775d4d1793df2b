"""The `mooncake-redis` operator CLI (click): serve, status, inspect, bench.

The entry point is `mooncake_redis.cli.main:cli` (console script `mooncake-redis`, or
`python -m mooncake_redis.cli`). In the repository it lives in cli/; the wheel ships it as
mooncake_redis.cli."""
