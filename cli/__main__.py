"""`python -m mooncake_redis.cli ...` runs the `mooncake-redis` CLI."""
from .main import cli

cli(prog_name="mooncake-redis")
