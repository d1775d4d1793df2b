"""What a Redis ACL can and cannot separate (docs/operations.md, "What an ACL cannot separate"):
the commands a function runs are checked against the caller's own user, on Valkey and on
Redis 7, so a user that may run the functions must hold their data commands itself."""
from __future__ import annotations

import uuid

import pytest
import redis

LIBRARY = "#!lua name=acltest\nredis.register_function('acltest_hset', function(keys) return redis.call('HSET', keys[1], 'f', 1) end)"


@pytest.mark.parametrize("server", ["valkey", "redis7"])
def test_a_function_runs_its_commands_as_the_caller(request, server):
    srv = request.getfixturevalue(server)
    admin = redis.Redis.from_url(srv.url)
    user = f"u{uuid.uuid4().hex[:8]}"
    admin.function_load(LIBRARY, replace=True)
    try:
        admin.execute_command("ACL", "SETUSER", user, "on", ">pw", "resetkeys", "~acl:*", "-@all", "+fcall")
        caller = redis.Redis(host="127.0.0.1", port=srv.port, username=user, password="pw")
        with pytest.raises(redis.ResponseError) as refused:
            caller.execute_command("FCALL", "acltest_hset", 1, "acl:k")
        assert "hset" in str(refused.value).lower() or "can't run this command" in str(refused.value)
        admin.execute_command("ACL", "SETUSER", user, "+hset")
        assert caller.execute_command("FCALL", "acltest_hset", 1, "acl:k") == 1  # and then HSET works directly too
        assert caller.hset("acl:k", "g", 1) == 1
        caller.close()
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.function_delete("acltest")
        admin.delete("acl:k")
        admin.close()
