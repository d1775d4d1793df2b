"""The examples of the README and of docs/*.md run as printed: every ```python and ```sh block of
a file, in order, in a directory where `mooncake-redis serve` runs (default data directory
./mooncake-data). A block that is not to be run says what it is (```text, ```yaml)."""
from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 30.0  # bound on waiting for serve's banner (polling, not a deadline)
RUN_TIMEOUT_S = 60.0

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)


RUNNABLE = ("python", "sh")
DOCS = ["README.md"] + sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))


def readme_blocks(lang: str | None = None, doc: str = "README.md") -> list[tuple[str, str]]:
    blocks = [(m.group(1), m.group(2)) for m in FENCE.finditer((REPO / doc).read_text())]
    return [b for b in blocks if lang is None or b[0] == lang]


def test_the_readme_has_runnable_examples():
    langs = [lang for lang, _ in readme_blocks()]
    assert langs.count("python") >= 1 and langs.count("sh") >= 1, langs


@pytest.mark.parametrize("doc", DOCS)
def test_every_block_is_run_or_marked(doc):
    # every fenced block is run, or says what it is not (a transcript, a file's text)
    langs = [lang for lang, _ in readme_blocks(doc=doc)]
    assert set(langs) <= {*RUNNABLE, "text", "yaml"}, (doc, langs)


# What each file's examples print, beside succeeding.
EXPECTED = {
    # the Python example printed the lease and one replica of 512 KiB
    "README.md": [r"^10000 \[\('node-a/seg0', \d+, 524288\)\]$",
                  # the shell examples found the store and the object
                  r"1 mounted", r"req42/block7"],
    # a member written after the retention is covered by it
    "docs/group-retention.md": [r"^1 retained True\n2$"],
    "docs/guarantees.md": [r"^4096 \d+\n\[1\]$"],
    "docs/radix.md": [r"^2\nTrue has_children"],
    "docs/cache-control.md": [r"pages hit; \d+ keys guaranteed"],
    # SGLang's tagged keys of one page, all ended by their page hash
    "docs/engines.md": [r"^sglang \[4\]$"],
}
RUN_DOCS = [d for d in DOCS if any(lang in RUNNABLE for lang, _ in readme_blocks(doc=d))]


def test_the_docs_with_examples_have_expected_outputs():
    assert set(EXPECTED) == set(RUN_DOCS), RUN_DOCS


def _env(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MOONCAKE_REDIS_URL", "MOONCAKE_DATA_DIR")}
    # `mooncake-redis` and `python` as installed next to this interpreter
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(tmp)
    return env


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({exc})"


def _serve_report(tmp: Path, proc: subprocess.Popen) -> str:
    """What serve left behind, for a failed block: whether it still runs, its stderr, Valkey's log."""
    state = "running" if proc.poll() is None else f"exited with {proc.returncode}"
    return (f"--- serve {state}; serve.err\n{_tail(tmp / 'serve.err')}\n"
            f"--- valkey.log\n{_tail(tmp / 'mooncake-data' / 'valkey.log')}")


@pytest.fixture
def serving(tmp_path):
    """`mooncake-redis serve` with no options, run in tmp_path."""
    env = _env(tmp_path)
    err = open(tmp_path / "serve.err", "w")
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_redis.cli", "serve"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        end = time.monotonic() + START_TIMEOUT_S
        banner = []
        for line in proc.stdout:
            banner.append(line)
            if line.strip().startswith("stop with") or time.monotonic() > end:
                break
        assert (tmp_path / "mooncake-data" / "url").exists(), "".join(banner) + (tmp_path / "serve.err").read_text()
        yield tmp_path, env, lambda: _serve_report(tmp_path, proc)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            try:  # serve could not stop its Valkey: do it here
                os.kill(int((tmp_path / "mooncake-data" / "valkey.pid").read_text()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        err.close()


@pytest.mark.xdist_group("gateway_default_ports")
def test_xdist_groups_take_effect(request):
    """The tests that bind the default ports share one worker only if --dist loadgroup sees
    their mark (it names the group in the node id); otherwise two serves race for port 50051."""
    if getattr(request.config.option, "loadgroup", False):  # set in each worker of --dist loadgroup
        assert request.node.nodeid.endswith("@gateway_default_ports"), request.node.nodeid
    else:
        pytest.skip("not run by pytest-xdist workers with --dist loadgroup")


@pytest.mark.slow
@pytest.mark.xdist_group("gateway_default_ports")  # serve as printed binds 50051 and 8080 when free
@pytest.mark.parametrize("doc", RUN_DOCS)
def test_examples_run_as_printed_against_serve(serving, doc):
    cwd, env, report = serving
    outputs = []
    for lang, code in readme_blocks(doc=doc):
        if lang == "python":
            argv = [sys.executable, "-c", code]
        elif lang == "sh":
            argv = ["bash", "-e", "-o", "pipefail", "-c", code]
        else:
            continue
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)  # not a terminal: nothing waits for a reader
        assert done.returncode == 0, f"{doc} {lang} block failed ({done.returncode}):\n{code}\n" \
                                     f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}\n{report()}"
        outputs.append(done.stdout)
    text = "\n".join(outputs)
    for pattern in EXPECTED[doc]:
        assert re.search(pattern, text, re.M), (doc, pattern, text)


@pytest.mark.slow
@pytest.mark.xdist_group("gateway_default_ports")
def test_the_quickstart_run_by_hand_keeps_its_client_alive_until_enter(serving):
    """From a terminal the quickstart waits at its prompt, node-a pinging: its object can be
    inspected for as long as the reader likes (here: while it waits), and Enter ends it."""
    cwd, env, _ = serving
    code = next(code for lang, code in readme_blocks("python"))
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=cwd, env=env, stdin=secondary,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.close(secondary)
    try:
        assert proc.stdout is not None
        printed = proc.stdout.readline()  # the lease and the replica
        assert re.match(r"^10000 \[\('node-a/seg0', \d+, 524288\)\]$", printed), printed
        prompt = proc.stdout.read(len("node-a keeps pinging"))  # input() flushes its prompt
        assert prompt == "node-a keeps pinging", prompt
        assert proc.poll() is None  # waiting, node-a alive
        seen = subprocess.run(["mooncake-redis", "inspect", "req42/block7", "--json"], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert seen.returncode == 0 and json.loads(seen.stdout)["found"] is True, seen.stderr
        os.write(primary, b"\n")
        assert proc.wait(timeout=RUN_TIMEOUT_S) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(primary)
