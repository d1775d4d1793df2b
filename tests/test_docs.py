"""The reference in docs/ lists exactly what the code has, no more and no fewer: the registered
functions (docs/protocol.md's function table), the error codes (its error table), the
MasterConfig fields (docs/configuration.md) and the CLI commands (docs/cli.md). The README stays a
front door (at most 15 KiB) that still names every function, and every relative link of the
README and docs/*.md reaches a file and, with a #fragment, one of its headings."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import click
import pytest

from mooncake_redis.cli.main import cli
from mooncake_redis.config import MasterConfig
from mooncake_redis.errors import ErrorCode
from mooncake_redis.library import library_source

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README_LIMIT = 15 * 1024


def read(name: str) -> str:
    return (REPO / name).read_text()


def table_rows(text: str, header: str) -> list[list[str]]:
    """The rows (cells, stripped) of the markdown table whose header row starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:  # past the header and the |---| line
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def first_code(cell: str) -> str:
    m = re.match(r"`([^`]*)`", cell)
    assert m, cell
    return m.group(1)


def registered_functions() -> set[str]:
    source = library_source()[0]
    return set(re.findall(r"""(?:\bregister\(\s*|function_name\s*=\s*)['"](mc_\w+)['"]""", source))


def test_the_function_table_lists_exactly_the_registered_functions():
    names = registered_functions()
    assert len(names) > 40, names
    documented = [first_code(row[0]) for row in table_rows(read("docs/protocol.md"), "| function | KEYS |")]
    assert len(documented) == len(set(documented)), "a function listed twice"
    assert set(documented) == names, (set(documented) - names, names - set(documented))


def test_the_readme_names_every_function():
    # a compact list in the README (one paragraph), the contracts in docs/protocol.md
    readme = read("README.md")
    listed = set(re.findall(r"`(mc_\w+)`", readme))
    assert listed == registered_functions(), listed ^ registered_functions()


def test_the_error_table_lists_exactly_the_error_codes():
    rows = table_rows(read("docs/protocol.md"), "| name | code |")
    documented = {first_code(row[0]): int(row[1]) for row in rows}
    assert len(documented) == len(rows)
    assert documented == {e.name: int(e) for e in ErrorCode}


def test_the_configuration_table_lists_exactly_the_fields():
    rows = table_rows(read("docs/configuration.md"), "| field | default |")
    documented = [first_code(row[0]) for row in rows]
    assert len(documented) == len(set(documented))
    assert set(documented) == {f.name for f in dataclasses.fields(MasterConfig)}


def commands(group: click.Group, prefix: tuple[str, ...] = ()) -> set[str]:
    """Every command that runs something, `bench ops` for a subcommand; a group is its commands."""
    found = set()
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found |= commands(command, prefix + (name,))
        else:
            found.add(" ".join(prefix + (name,)))
    return found


def test_the_command_table_lists_exactly_the_cli_commands():
    groups = {name for name, c in cli.commands.items() if isinstance(c, click.Group)}
    documented = set()
    for row in table_rows(read("docs/cli.md"), "| command |"):
        words = first_code(row[0]).split()
        documented.add(" ".join(words[:2]) if words[0] in groups else words[0])
    assert documented == commands(cli), (documented - commands(cli), commands(cli) - documented)


# --redis and --namespace after a command's name: documented once, under the global options
STORE_OPTIONS = {"--redis", "--namespace"}


def leaf_commands(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from leaf_commands(command, prefix + (name,))
        else:
            yield " ".join(prefix + (name,)), command


def test_the_command_table_lists_every_option():
    groups = {name for name, c in cli.commands.items() if isinstance(c, click.Group)}
    text = read("docs/cli.md")
    rows: dict[str, str] = {}
    for row in table_rows(text, "| command |"):
        words = first_code(row[0]).split()
        name = " ".join(words[:2]) if words[0] in groups else words[0]
        rows[name] = rows.get(name, "") + " ".join(row)
    missing = {}
    for name, command in leaf_commands(cli):
        options = {o for p in command.params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts
                   if o.startswith("--")} - STORE_OPTIONS - {"--help"}
        absent = sorted(o for o in options if not re.search(re.escape(o) + r"(?![\w-])", rows[name]))
        if absent:
            missing[name] = absent
    assert not missing, missing
    # the store options after a command's name are said once, beside the global options
    assert "`mooncake-redis serve --redis URL`" in text


def test_the_readme_is_a_front_door():
    size = len(read("README.md").encode())
    assert size <= README_LIMIT, f"README.md is {size} bytes: move reference to docs/"


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```$", "", path.read_text(), flags=re.M | re.S)
    return {anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


LINKED = [REPO / "README.md"] + sorted(DOCS.glob("*.md"))


@pytest.mark.parametrize("doc", LINKED, ids=lambda p: p.name)
def test_relative_links_resolve(doc):
    text = re.sub(r"^```.*?^```$", "", doc.read_text(), flags=re.M | re.S)
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, fragment = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            bad.append(target)
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            bad.append(target)
    assert not bad, bad
