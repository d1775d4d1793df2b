"""The `mooncake-redis` operator CLI (click): serve, status, inspect, bench.

The entry point is `cli.main:cli` (console script `mooncake-redis`, or `python -m cli`)."""
