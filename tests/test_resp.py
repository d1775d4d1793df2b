"""The lean transport (mooncake_redis.transport.resp): function calls to a plain server on a socket of our
own. It must keep transport.run's semantics exactly: the same replies (values and Python types),
the same MasterErrors, the reload on "Function not found", OUTCOME_UNKNOWN on a lost reply."""
from __future__ import annotations

import gc
import os
import signal
import socket
import threading
import weakref

import pytest
import redis

from helpers import T0, mount, put, raises_code
from mooncake_redis import ErrorCode, Master, MasterConfig, MasterError
from mooncake_redis.transport import resp, run
from mooncake_redis.server import EmbeddedValkey

# A library of the tests' own, beside `mooncake`: replies of every shape a function can give.
TEST_LIBRARY = """#!lua name=mctest
redis.register_function('mct_echo', function(keys, args) return args end)
redis.register_function('mct_shapes', function(keys, args)
  return {1, 'two', false, {3, {'four', true}}, 5.9, -0, {}}
end)
redis.register_function('mct_nil', function(keys, args) return nil end)
redis.register_function('mct_false', function(keys, args) return false end)
redis.register_function('mct_status', function(keys, args) return {ok = 'FINE'} end)
redis.register_function('mct_error', function(keys, args) return redis.error_reply(args[1]) end)
redis.register_function('mct_error_inside', function(keys, args) return {7, redis.error_reply(args[1])} end)
redis.register_function('mct_error_first', function(keys, args) return {redis.error_reply(args[1]), 7} end)
redis.register_function('mct_wrongtype', function(keys, args) return redis.call('HGET', keys[1], 'f') end)
"""
ERRORS = ["OBJECT_NOT_FOUND -704 no such object", "INVALID_PARAMS -600", "LOADING the dataset",
          "BUSY a script runs", "MASTERDOWN link down", "ERR something else", "NOPERM no", "OOM full",
          "READONLY replica", "NOAUTH Authentication required.", "ERR max number of clients reached"]


@pytest.fixture(params=["valkey", "redis"])
def server(request):
    """A real server (Valkey, Redis 7) with the test library loaded and an empty keyspace."""
    srv = request.getfixturevalue({"valkey": "valkey", "redis": "redis7"}[request.param])
    admin = redis.Redis.from_url(srv.url)
    admin.flushall()
    admin.execute_command("FUNCTION", "LOAD", "REPLACE", TEST_LIBRARY)
    yield srv
    try:
        admin.execute_command("FUNCTION", "DELETE", "mctest")
    except redis.ResponseError:  # a test flushed the functions
        pass
    admin.close()


@pytest.fixture
def client(server):
    c = redis.Redis.from_url(server.url)
    yield c
    resp.close(c)
    c.close()


@pytest.fixture
def lean_calls(monkeypatch):
    """Counts the batches the lean transport sends."""
    sent = []
    real = resp.LeanClient.send

    def send(self, commands):
        sent.append(len(commands))
        return real(self, commands)

    monkeypatch.setattr(resp.LeanClient, "send", send)
    return sent


def shape(x):
    """A reply as nested (type, value) pairs: 1 and True, b'1' and '1' differ; errors compare by
    code and message."""
    if isinstance(x, list):
        return ("list", [shape(v) for v in x])
    if isinstance(x, MasterError):
        return ("MasterError", x.code, x.message)
    if isinstance(x, Exception):
        return (type(x).__name__, str(x))
    return (type(x).__name__, x)


def outcome(client, commands, raise_on_error):
    try:
        return shape(run(client, commands, raise_on_error))
    except MasterError as exc:
        return ("raised", shape(exc))


def both_paths(client, commands, monkeypatch, raise_on_error=True):
    """transport.run's outcome through the lean transport and through redis-py."""
    lean = outcome(client, commands, raise_on_error)
    with monkeypatch.context() as mp:
        mp.setattr(resp, "lean_for", lambda *a: None)
        plain = outcome(client, commands, raise_on_error)
    return lean, plain


CALLS = [("FCALL", "mct_echo", 0, "text", b"\xff\x00bytes", 42, -7, 1.5, 10 ** 30, ""),
         ("FCALL", "mct_shapes", 0), ("FCALL_RO", "mct_nil", 0), ("FCALL", "mct_false", 0),
         ("FCALL", "mct_status", 0), ("FCALL_RO", "mc_version", 0)]


@pytest.mark.parametrize("call", CALLS, ids=lambda c: c[1])
def test_replies_are_redis_pys_values_and_types(client, call, monkeypatch, lean_calls):
    run(client, [("FCALL_RO", "mc_version", 0)])  # loads the mooncake library
    lean, plain = both_paths(client, [call], monkeypatch)
    assert lean == plain and lean_calls
    lean, plain = both_paths(client, [call] * 3, monkeypatch)
    assert lean == plain


@pytest.mark.parametrize("text", ERRORS)
@pytest.mark.parametrize("fn", ["mct_error", "mct_error_inside", "mct_error_first"])
def test_error_replies_map_as_through_redis_py(client, fn, text, monkeypatch, lean_calls):
    call = ("FCALL", fn, 0, text)
    for raise_on_error in (True, False):
        lean, plain = both_paths(client, [call], monkeypatch, raise_on_error)
        assert lean == plain, (lean, plain)
    assert lean_calls


def test_error_codes_through_the_lean_path(client, lean_calls):
    cases = {"OBJECT_NOT_FOUND -704 gone": ErrorCode.OBJECT_NOT_FOUND, "LOADING the dataset": ErrorCode.UNAVAILABLE,
             "BUSY a script runs": ErrorCode.UNAVAILABLE, "ERR other": ErrorCode.INTERNAL_ERROR,
             "ERR max number of clients reached": ErrorCode.OUTCOME_UNKNOWN}
    for text, code in cases.items():
        with raises_code(code):
            run(client, [("FCALL", "mct_error", 0, text)])
    client.set("str", "x")
    with raises_code(ErrorCode.INTERNAL_ERROR):  # WRONGTYPE, raised inside the function
        run(client, [("FCALL", "mct_wrongtype", 1, "str")])
    # A pipeline keeps each error in its place, LOADING too (redis-py's own pipeline would raise
    # its ConnectionError: the lean path keeps the documented meaning, the call did not run).
    replies = run(client, [("FCALL", "mct_error", 0, "LOADING x"), ("FCALL", "mct_echo", 0, "a"),
                           ("FCALL", "mct_error", 0, "OBJECT_HAS_LEASE -706 leased")], raise_on_error=False)
    assert [getattr(r, "code", r) for r in replies] == [ErrorCode.UNAVAILABLE, [b"a"], ErrorCode.OBJECT_HAS_LEASE]
    assert lean_calls and run(client, [("FCALL", "mct_echo", 0, "still in step")]) == [[b"still in step"]]


@pytest.mark.parametrize("bad", [True, object(), None, [1], {"a": 1}], ids=["True", "object", "None", "list", "dict"])
def test_bad_argument_types_are_invalid_params_and_nothing_is_sent(client, bad, monkeypatch, lean_calls):
    calls = [("FCALL", "mct_echo", 0, "first"), ("FCALL", "mct_echo", 0, "x", bad)]
    lean, plain = both_paths(client, calls, monkeypatch)
    assert lean == plain and lean[0] == "raised" and lean[1][1] == ErrorCode.INVALID_PARAMS
    assert run(client, [("FCALL", "mct_echo", 0, "next")]) == [[b"next"]]
    assert len(lean_calls) == 2


def test_other_commands_and_clients_keep_redis_py(server, valkey_cluster):
    import fakeredis

    from mooncake_redis.transport import client_from_url

    fcall = [("FCALL_RO", "mc_version", 0)]
    plain = redis.Redis.from_url(server.url)
    assert resp.lean_for(plain, fcall) is not None
    assert resp.lean_for(plain, [*fcall, ("HGETALL", "h")]) is None  # redis-py reshapes HGETALL
    assert resp.lean_for(redis.Redis.from_url(server.url, decode_responses=True), fcall) is None
    assert resp.lean_for(redis.Redis.from_url(server.url.replace("redis://", "rediss://")), fcall) is None
    assert resp.lean_for(fakeredis.FakeRedis(), fcall) is None
    assert resp.lean_for(client_from_url("memory://lean"), fcall) is None
    assert resp.lean_for(redis.Redis.from_url(server.url, single_connection_client=True), fcall) is None
    cluster = client_from_url(valkey_cluster.url)
    try:
        assert run(cluster, fcall)[0]  # transport.run sends cluster clients by cluster.send
    finally:
        cluster.close()


def test_a_flushed_library_is_reloaded_and_the_calls_run_again(server, lean_calls):
    m = Master.connect(server.url, MasterConfig(shards=4))
    try:
        m.freeze_clock(T0)
        mount(m, "seg", 1 << 16)
        keys = [f"k{i}" for i in range(12)]
        admin = redis.Redis.from_url(server.url)
        admin.execute_command("FUNCTION", "FLUSH")
        assert m.batch_put_start("w", keys, [10] * 12) and m.batch_put_end("w", keys) == [ErrorCode.OK] * 12
        admin.execute_command("FUNCTION", "FLUSH")
        assert m.exist_key("k3") and not m.exist_key("other")
        assert len(lean_calls) >= 4  # each first attempt, then each re-run after the reload
        admin.close()
    finally:
        m.close()


def test_auth_with_a_password_and_a_refused_login(lean_calls):
    with EmbeddedValkey(appendonly=False, password="lean-pw") as srv:
        m = Master.connect(srv.url, MasterConfig(shards=2))
        try:
            m.freeze_clock(T0)
            mount(m, "seg", 1 << 16)
            put(m, "k", 10)
            assert m.exist_key("k") and lean_calls
            admin = redis.Redis.from_url(srv.url)
            admin.config_set("requirepass", "another-pw")  # open connections stay logged in
            assert m.exist_key("k")
            m.transport.close()  # the next call logs in again, with the URL's (now wrong) password
            with pytest.raises(MasterError) as info:
                m.exist_key("k")
            assert info.value.code == ErrorCode.INTERNAL_ERROR and "refused the login" in info.value.message
            admin.config_set("requirepass", "lean-pw")
            assert m.exist_key("k")
            admin.close()
        finally:
            m.close()


def test_a_unix_socket_server(tmp_path, lean_calls):
    path = tmp_path / "valkey.sock"
    with EmbeddedValkey(appendonly=False, extra_args=("--unixsocket", str(path), "--unixsocketperm", "700")):
        m = Master.connect(f"unix://{path}", MasterConfig(shards=2))
        try:
            m.freeze_clock(T0)
            mount(m, "seg", 1 << 16)
            put(m, "k", 10)
            assert m.exist_key("k") and m.batch_exist_key(["k", "other"]) == [True, False]
            assert lean_calls
            conn = resp._clients[m.redis].local.conn
            assert isinstance(conn.redis_conn, redis.UnixDomainSocketConnection) and conn.sock.family == socket.AF_UNIX
        finally:
            m.close()


def test_a_server_killed_mid_call_is_outcome_unknown_then_calls_recover(tmp_path, monkeypatch):
    srv = EmbeddedValkey(data_dir=str(tmp_path / "data"), extra_args=("--appendfsync", "always")).start()
    m = None
    try:
        m = Master.connect(srv.url, MasterConfig(shards=1), socket_timeout=60)
        m.freeze_clock(T0)
        mount(m, "seg", 1 << 16)
        put(m, "k", 10)
        reading, opened, go = threading.Event(), threading.Event(), threading.Event()
        real_read = resp._Connection.read

        def read(self):
            if go.is_set():
                reading.set()  # the request is written: the reply is awaited
            return real_read(self)

        monkeypatch.setattr(resp._Connection, "read", read)
        failed = []

        def call():
            assert m.exist_key("k")  # this thread's connection, opened while the server answers
            opened.set()
            go.wait()
            try:
                m.add_task_ref("k")
            except MasterError as exc:
                failed.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        assert opened.wait(30)
        os.kill(srv.proc.pid, signal.SIGSTOP)  # the server takes the request but never answers
        go.set()
        assert reading.wait(30)
        os.kill(srv.proc.pid, signal.SIGKILL)
        caller.join(30)
        assert not caller.is_alive() and [e.code for e in failed] == [ErrorCode.OUTCOME_UNKNOWN]
        assert "may or may not" in failed[0].message
        srv.proc.wait()
        monkeypatch.undo()
        with raises_code(ErrorCode.OUTCOME_UNKNOWN):  # nobody listens: connecting fails
            m.exist_key("k")
        srv = EmbeddedValkey(data_dir=srv.data_dir, port=srv.port).start()  # the same store, restarted
        assert m.exist_key("k") and m.task_refs("k") == 0  # the killed call never ran
        assert m.add_task_ref("k") == 1
    finally:
        if m is not None:
            m.close()
        if srv.proc and srv.proc.poll() is None:
            os.kill(srv.proc.pid, signal.SIGCONT)
        srv.stop()


def test_a_connection_the_server_closed_while_idle_is_replaced(server, client, lean_calls):
    assert run(client, [("FCALL", "mct_echo", 0, "before")]) == [[b"before"]]
    admin = redis.Redis.from_url(server.url)
    assert admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes") >= 1
    assert run(client, [("FCALL", "mct_echo", 0, "after")]) == [[b"after"]]
    admin.close()


def test_threads_each_get_their_own_replies(client, lean_calls):
    errors: list = []
    conns: set = set()
    start = threading.Barrier(8)

    def hammer(t: int) -> None:
        try:
            start.wait()
            run(client, [("FCALL", "mct_echo", 0, "first")])
            conns.add(resp._clients[client].local.conn)  # kept: a thread's ends with it
            for i in range(300):
                tag = f"t{t}-{i}"
                if i % 3 == 0:
                    got = run(client, [("FCALL", "mct_echo", 0, tag, i), ("FCALL", "mct_echo", 0, tag + "b")])
                    assert got == [[tag.encode(), str(i).encode()], [(tag + "b").encode()]], got
                else:
                    got = run(client, [("FCALL", "mct_echo", 0, tag)])
                    assert got == [[tag.encode()]], got
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:3]
    assert len(conns) == 8  # one connection per thread


@pytest.mark.slow
def test_a_thread_that_ends_takes_its_connection_with_it(client):
    lean_conn = []

    def one_call():
        run(client, [("FCALL", "mct_echo", 0, "x")])
        lean_conn.append(weakref.ref(resp._clients[client].local.conn.redis_conn))

    th = threading.Thread(target=one_call)
    th.start()
    th.join()
    gc.collect()
    assert lean_conn and lean_conn[0]() is None  # collected: redis-py's Connection closed its socket
    assert not list(resp._clients[client].open)


def test_a_forked_child_opens_its_own_connection(client, lean_calls):
    assert run(client, [("FCALL", "mct_echo", 0, "parent")]) == [[b"parent"]]
    lean = resp._clients[client]
    inherited = lean.local.conn
    pid = os.fork()
    if pid == 0:  # the child: both processes call at once; a shared socket would mix replies
        ok = False
        try:
            for i in range(300):
                assert run(client, [("FCALL", "mct_echo", 0, f"child-{i}")]) == [[f"child-{i}".encode()]]
            ok = lean.local.conn is not inherited
        finally:
            os._exit(0 if ok else 1)
    for i in range(300):
        assert run(client, [("FCALL", "mct_echo", 0, f"parent-{i}")]) == [[f"parent-{i}".encode()]]
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert lean.local.conn is inherited  # the parent's connection lives on, in step


def test_close_closes_every_threads_connection_and_calls_reopen(client):
    run(client, [("FCALL", "mct_echo", 0, "x")])
    lean = resp._clients[client]
    called, gate = threading.Event(), threading.Event()

    def call_and_wait():
        run(client, [("FCALL", "mct_echo", 0, "y")])
        called.set()
        gate.wait()  # the thread (and its connection) lives on until close()

    th = threading.Thread(target=call_and_wait)
    th.start()
    assert called.wait(30)
    conns = list(lean.open)
    assert len(conns) == 2
    resp.close(client)
    assert not list(lean.open) and all(c.redis_conn._sock is None for c in conns)
    assert run(client, [("FCALL", "mct_echo", 0, "z")]) == [[b"z"]] and len(lean.open) == 1
    gate.set()
    th.join()
