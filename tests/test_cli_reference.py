"""docs/reference/cli.md is what docs/gen_cli_reference.py makes of the parser today, and each command's
real `--help`, run as a user runs it, appears in it word for word."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jobsup.cli import COMMANDS

from .helpers import ROOT

_spec = importlib.util.spec_from_file_location("gen_cli_reference", ROOT / "docs" / "gen_cli_reference.py")
assert _spec is not None and _spec.loader is not None
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

FIX = f"run {gen.REGENERATE}"


def _committed() -> str:
    assert gen.TARGET.exists(), f"{gen.TARGET.relative_to(ROOT)} is missing: {FIX}"
    return gen.TARGET.read_text()


def _same_python() -> None:
    """Skip when another Python rendered the page: argparse lays help out differently between minor
    versions, and the page is made by one."""
    by = gen.rendered_by(_committed())
    if by != gen.python():
        pytest.skip(f"docs/reference/cli.md was rendered by {by}'s argparse; this is {gen.python()}")


def test_the_committed_reference_is_current():
    _same_python()
    assert gen.render() == _committed(), f"docs/reference/cli.md is not what the parser gives: {FIX}"


def _command() -> list[str]:
    """The installed `jobsup` script beside this Python, else `python -m jobsup` (the same prog)."""
    script = Path(sys.executable).parent / "jobsup"
    if script.exists():
        return [str(script)]
    found = shutil.which("jobsup")
    return [found] if found else [sys.executable, "-m", "jobsup"]


@pytest.mark.parametrize("name", ["", *COMMANDS], ids=["jobsup", *COMMANDS])
def test_the_real_help_appears_verbatim(name):
    _same_python()
    env = gen.help_environ(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    args = [*_command(), *([name] if name else []), "--help"]
    result = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    shown = gen.machine_free(result.stdout)
    assert "```text\n" + shown.rstrip("\n") + "\n```\n" in _committed(), (
        f"`jobsup {name} --help` is not in docs/reference/cli.md as it prints now: {FIX}"
    )


def test_every_variable_is_in_the_configuration_page():
    """Each JOBSUP_* variable that a --help names or the package reads has its row in configuration.md."""
    named = set(re.findall(r"\bJOBSUP_[A-Z_]*[A-Z]\b", _committed()))
    read = {
        name
        for path in (ROOT / "jobsup").rglob("*.py")
        for name in re.findall(r"\bJOBSUP_[A-Z_]*[A-Z]\b", path.read_text())
        if name != "JOBSUP_EXAMPLE"  # options.env_note's doctest
    }
    page = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    missing = sorted(name for name in named | read | {"DATABASE_URL"} if f"`{name}`" not in page)
    assert not missing, f"docs/reference/configuration.md does not name {', '.join(missing)}"
