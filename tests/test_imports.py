"""Every module of the package imports, and no module imports itself through others: the import
graph of mooncake_redis read from the sources (every import statement, those inside functions
too) has no cycle. cli/ and bench/ (shipped as mooncake_redis.cli and .bench) have no cycle but
the ones listed in KNOWN_CYCLES, which may only go away."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Source directories and the package each is shipped as (pyproject.toml's package-dir).
SOURCES = {"mooncake_redis": ROOT / "mooncake_redis", "mooncake_redis.cli": ROOT / "cli",
           "mooncake_redis.bench": ROOT / "bench"}


# Import cycles of cli/ and bench/ that predate this test (broken at run time by imports inside
# functions): the replay benchmark's model and policies, which import its records.
KNOWN_CYCLES = [{"mooncake_redis.bench.replay", "mooncake_redis.bench.replay_model",
                 "mooncake_redis.bench.replay_policies"}]


def modules() -> dict[str, tuple[Path, bool]]:
    """Every module: its name -> (its file, whether it is a package's __init__)."""
    out: dict[str, tuple[Path, bool]] = {}
    for package, top in SOURCES.items():
        for path in sorted(top.rglob("*.py")):
            parts = list(path.relative_to(top).with_suffix("").parts)
            if any(p.startswith(".") or p == "__pycache__" for p in parts):
                continue
            init = parts[-1] == "__init__"
            name = ".".join([package, *parts[:-1]] if init else [package, *parts])
            out[name] = (path, init)
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of import nodes under `if TYPE_CHECKING:` (not imported at run time)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imports(name: str, path: Path, init: bool, known: set[str]) -> set[str]:
    """The package's modules that importing `name` imports first: each module an import
    statement names (anywhere in the file, except under TYPE_CHECKING: `from P import a` names P
    unless every name is a module P.a), and the packages above each that `name` is not itself
    inside (their __init__ runs first)."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_only(tree)
    here = name if init else name.rpartition(".")[0]  # the package relative imports start from
    named: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            named.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(here.split(".")[:len(here.split(".")) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            subs = {f"{target}.{a.name}" for a in node.names} & known
            named.update(subs)
            if len(subs) < len(node.names):
                named.add(target)
    own = {name, *ancestors(name)}
    out: set[str] = set()
    for target in named & known:
        out.add(target)
        out.update(p for p in ancestors(target) if p not in own)
    out.discard(name)
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, init, set(mods)) for name, (path, init) in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The graph's strongly connected components of more than one module (each holds a cycle)."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        reach[start] = seen
    out: list[set[str]] = []
    for node in sorted(graph):
        group = {other for other in reach[node] if node in reach[other]} | {node}
        if len(group) > 1 and group not in out:
            out.append(group)
    return out


def _is_cli_or_bench(name: str) -> bool:
    return name.startswith(("mooncake_redis.cli.", "mooncake_redis.bench.")) or name in (
        "mooncake_redis.cli", "mooncake_redis.bench")


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert {"mooncake_redis.transport", "mooncake_redis.library", "mooncake_redis.cli.main"} <= set(graph)
    assert "mooncake_redis.library" in graph["mooncake_redis.master"]
    package = {name: {t for t in targets if not _is_cli_or_bench(t)}
               for name, targets in graph.items() if not _is_cli_or_bench(name)}
    cycle = find_cycle(package)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_cli_and_bench_have_no_new_import_cycle():
    for group in cycles(import_graph()):
        assert any(group <= known for known in KNOWN_CYCLES), f"import cycle among {sorted(group)}"


def test_the_transport_does_not_import_the_library():
    """The library loads itself through the transport (and installs itself there): the other way
    round would be a cycle."""
    graph = import_graph()
    for name, targets in graph.items():
        if name.startswith("mooncake_redis.transport"):
            assert not any(t == "mooncake_redis.library" or not t.startswith("mooncake_redis.transport")
                           and t not in ("mooncake_redis.errors", "mooncake_redis.config", "mooncake_redis.keys",
                                         "mooncake_redis.steps")
                           for t in targets), (name, sorted(targets))


def test_the_walk_finds_a_cycle(tmp_path):
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    files = {"p/__init__.py": "", "p/sub/__init__.py": "from .x import f\n", "p/q.py": "from .sub.x import f\n",
             "p/sub/x.py": "from .. import q\ndef f(): from ..q import g\n", "p/r.py": "from . import q, sub\n",
             "p/t.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .q import g\n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    known = {"p", "p.sub", "p.q", "p.sub.x", "p.r", "p.t"}

    def edges(name: str, rel: str) -> set[str]:
        return imports(name, tmp_path / rel, rel.endswith("__init__.py"), known)

    assert edges("p.sub", "p/sub/__init__.py") == {"p.sub.x"}
    assert edges("p.q", "p/q.py") == {"p.sub.x", "p.sub"}  # p.sub's __init__ runs first
    assert edges("p.sub.x", "p/sub/x.py") == {"p.q"}  # an import inside a function counts too
    assert edges("p.r", "p/r.py") == {"p.q", "p.sub"}
    assert edges("p.t", "p/t.py") == set()
    graph = {name: edges(name, rel) for name, rel in [("p.sub", "p/sub/__init__.py"), ("p.q", "p/q.py"),
                                                       ("p.sub.x", "p/sub/x.py")]}
    assert find_cycle(graph) == ["p.q", "p.sub", "p.sub.x", "p.q"]
    assert cycles(graph) == [{"p.q", "p.sub", "p.sub.x"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("name", sorted(n for n in modules() if not n.endswith(".__main__")))  # __main__ runs
def test_every_module_imports(name):
    importlib.import_module(name)


def test_the_old_import_paths_are_the_new_objects():
    """functions, resp, cluster and master._redis_from_url: kept for cli/ and bench/."""
    from mooncake_redis import cluster, functions, library, master, resp, transport
    from mooncake_redis.transport import cluster as transport_cluster
    from mooncake_redis.transport import replies
    from mooncake_redis.transport import resp as transport_resp

    assert master._redis_from_url is transport.client_from_url
    assert functions.run is transport.run and functions.error_of is transport.error_of
    assert functions.library_source is library.library_source and functions.FUNCTION_MISSING is replies.FUNCTION_MISSING
    assert resp.lean_for is transport_resp.lean_for and cluster.primary_clients is transport_cluster.primary_clients
    assert replies._library is library  # installed when the library module is imported
