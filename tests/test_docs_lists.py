"""The lists the documentation promises are whole: every command in the commands table of
docs/operations/start.md, every guide where the README and the docs' index say where to read on, and
every log action the supervisor emits in start.md's list of them (and nothing there that it does not)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from jobsup.cli import COMMANDS

from .helpers import ROOT

START = ROOT / "docs" / "operations" / "start.md"
GUIDES = sorted((ROOT / "docs" / "guides").glob("*.md"))
ACTION = re.compile(r"^[a-z_]+(\.[a-z_]+)*$")


def section(path: Path, heading: str) -> str:
    """The text under `heading` (the whole heading, an anchor `{ #... }` aside), up to the next heading."""
    text = path.read_text()
    start = next(m.end() for m in re.finditer(rf"^#+ {re.escape(heading)}( \{{.*\}})?$", text, re.MULTILINE))
    end = re.search(r"^#+ ", text[start:], re.MULTILINE)
    return text[start : start + end.start()] if end else text[start:]


def code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def tabled_commands(text: str) -> set[str]:
    """The commands the first cells of a Markdown table name: `jobsup NAME ...`, or `NAME ...` beside it
    (`pause QUEUE` in the row of `jobsup cancel`)."""
    found = set()
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split(" | ")[0]
        for span in code_spans(first):
            found.add(span.removeprefix("jobsup ").split()[0])
    return found


def emitted_actions(package: Path = ROOT / "jobsup") -> dict[str, str]:
    """Every log action the code writes, with a file that writes it: the first argument of a call to
    `log(...)`, `self.log(...)` or `.alike(...)`, and the action `route(log, logger, ACTION)` gives."""
    found: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func, args = node.func, node.args
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            at = 0 if name in ("log", "alike") else 2 if name == "route" else None
            if at is not None and len(args) > at and isinstance(args[at], ast.Constant):
                value = args[at].value
                if isinstance(value, str) and ACTION.match(value):
                    found.setdefault(value, str(path.relative_to(package)))
    return found


def test_the_commands_table_names_every_command():
    listed = tabled_commands(section(START, "Commands"))
    assert set(COMMANDS) - listed == set(), "commands missing from the table of docs/operations/start.md"
    assert listed - set(COMMANDS) == set(), "the table names commands that do not exist"


def test_where_to_read_on_names_every_guide():
    for page, heading, prefix in (
        (ROOT / "docs" / "index.md", "Where to read on", "guides/"),
        (ROOT / "README.md", "Documentation", "docs/guides/"),
    ):
        linked = set(re.findall(rf"\]\({re.escape(prefix)}([\w-]+\.md)", section(page, heading)))
        missing = {g.name for g in GUIDES} - linked
        assert not missing, f"{page.relative_to(ROOT)} ({heading}) does not link {sorted(missing)}"


def test_the_log_section_lists_every_action_the_supervisor_emits():
    emitted = emitted_actions()
    assert {"supervisor.started", "app.loaded", "job.dead", "db.driver", "limit.declared"} <= set(emitted)
    # The list after the sentence that announces it, up to the blank line that ends it.
    bullets = section(START, "Logs").split("Every action the supervisor logs:")[1].strip().split("\n\n")[0]
    listed = {span for span in code_spans(bullets) if ACTION.match(span)}
    missing = {action: where for action, where in emitted.items() if action not in listed}
    assert not missing, f"log actions missing from the list in docs/operations/start.md: {missing}"
    assert listed - set(emitted) == set(), "docs/operations/start.md lists log actions nothing emits"


def test_the_collectors_on_made_up_text(tmp_path: Path):
    table = "| command | what |\n|---|---|\n| `jobsup top` | x |\n| `jobsup cancel --id N`, `pause QUEUE` | y |\n"
    assert tabled_commands(table) == {"top", "cancel", "pause"}
    (tmp_path / "m.py").write_text(
        "log('a.b', 'info')\nself.log.alike('c.d', like=())\nroute(log, 'psycopg', 'e.f')\nlog(name)\nprint('g.h')\n"
    )
    assert emitted_actions(tmp_path) == {"a.b": "m.py", "c.d": "m.py", "e.f": "m.py"}
