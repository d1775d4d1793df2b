"""The README's examples run as printed: every ```python and ```sh block, in order, in a
directory where `mooncake-redis serve` runs (default data directory ./mooncake-data)."""
from __future__ import annotations

import os
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


def readme_blocks(lang: str | None = None) -> list[tuple[str, str]]:
    blocks = [(m.group(1), m.group(2)) for m in FENCE.finditer((REPO / "README.md").read_text())]
    return [b for b in blocks if lang is None or b[0] == lang]


def test_the_readme_has_runnable_examples():
    langs = [lang for lang, _ in readme_blocks()]
    assert langs.count("python") >= 1 and langs.count("sh") >= 1, langs
    # every fenced block is run, or says what it is not (a transcript, a file's text)
    assert set(langs) <= {"python", "sh", "text", "yaml"}, langs


def _env(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MOONCAKE_REDIS_URL", "MOONCAKE_DATA_DIR")}
    # `mooncake-redis` and `python` as installed next to this interpreter
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(tmp)
    return env


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
        yield tmp_path, env
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


@pytest.mark.slow
def test_readme_examples_run_as_printed_against_serve(serving):
    cwd, env = serving
    outputs = []
    for lang, code in readme_blocks():
        if lang == "python":
            argv = [sys.executable, "-c", code]
        elif lang == "sh":
            argv = ["bash", "-e", "-o", "pipefail", "-c", code]
        else:
            continue
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert done.returncode == 0, f"README {lang} block failed ({done.returncode}):\n{code}\n" \
                                     f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        outputs.append(done.stdout)
    text = "\n".join(outputs)
    # the Python example printed the lease and one replica of 512 KiB
    assert re.search(r"^10000 \[\('node-a/seg0', \d+, 524288\)\]$", text, re.M), text
    # the shell examples found the store and the object
    assert "1 mounted" in text and "req42/block7" in text, text
    # the group retention example: a member written after the retention is covered by it
    assert re.search(r"^1 retained True\n2$", text, re.M), text
