"""The architecture page's layout and import tables name every module of jobsup/, and the import table's
rows are the layers of the import contract in pyproject.toml, in order (docs/design/architecture.md,
"Layout"). lint-imports checks the code against the contract; this checks the page against both."""

from __future__ import annotations

import re
import tomllib

from .helpers import ROOT

PACKAGE = ROOT / "jobsup"
PAGE = ROOT / "docs" / "design" / "architecture.md"
# Packages whose every module the layout table names (the CLI's row names its rule instead: one module
# per command, named as it is typed).
NAMED_MODULE_BY_MODULE = ("db", "ops", "supervisor", "monitor")


def top_level() -> set[str]:
    """The modules and packages directly under jobsup/, without .py or a trailing slash."""
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    return modules | {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}


def table(heading: str) -> list[list[str]]:
    """The cells of each row of the first table after `heading` (its header and rule left out)."""
    text = PAGE.read_text()
    rest = text[text.index(heading) :].splitlines()
    rows = []
    for line in rest[1:]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            break
    return rows[2:]


def names(cell: str) -> list[str]:
    """The module names of a table's first cell: `app.py`, `cli/`, `ops/`, `django` -> app, cli, ops, django."""
    return [re.sub(r"(\.py|/)$", "", name) for name in re.findall(r"`([^`]+)`", cell)]


def contract_layers() -> list[set[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [layers] = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return [{name.strip() for name in layer.split("|")} for layer in layers["layers"]]


def test_the_layout_table_names_every_module_once():
    named = [name for row in table("Inside `jobsup/`, code is sorted") for name in names(row[0])]
    named.remove("__init__")
    assert sorted(named) == sorted(top_level())


def test_the_import_table_is_the_layers_contract_in_order():
    rows = [set(names(row[0])) for row in table("### What each part may import") if row[0] != "all of `jobsup`"]
    assert rows == contract_layers()
    assert set().union(*rows) == top_level()  # the contract is exhaustive: lint-imports refuses a module left out


def test_the_layout_table_names_every_module_of_the_packages_it_lists():
    rows = {names(row[0])[0]: row[1] for row in table("Inside `jobsup/`, code is sorted")}
    for package in NAMED_MODULE_BY_MODULE:
        files = {p.name for p in (PACKAGE / package).glob("*.py") if p.name != "__init__.py"}
        missing = sorted(name for name in files if f"`{name}`" not in rows[package])
        assert not missing, f"the layout row of {package}/ does not name {missing}"


# The rooms the dispatcher builds (architecture page, "The supervisor's loop"): only they and the
# dispatcher hold one another; the rest of the supervisor calls the Dispatcher's methods.
ROOMS = {"claimer", "handout", "writer", "renewer", "held", "pace"}


def test_no_module_of_the_supervisor_reaches_into_the_dispatchers_rooms():
    import ast

    offences = []
    for path in sorted((PACKAGE / "supervisor").glob("*.py")):
        if path.stem in ROOMS | {"dispatcher"}:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ROOMS:
                offences.append(f"{path.name}:{node.lineno}: .{node.attr}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] in ROOMS - {"pace"}:
                offences.append(f"{path.name}:{node.lineno}: imports {node.module}")
    assert offences == []
    # The check finds what the supervisor did before the rooms: the hard stop wrote the hand-back buffer.
    assert any(isinstance(n, ast.Attribute) and n.attr in ROOMS for n in ast.walk(ast.parse("d.writer.release(x)")))
