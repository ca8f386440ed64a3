"""The Python examples of the documentation run: every ```python block of README.md and docs/**/*.md.

One case per page (its id is the page's path), whose blocks run in order in one fresh Python process,
sharing their names as the cells of a notebook do: the repository's root on PYTHONPATH, a temporary
directory as the current one (also on sys.path), JOBSUP_DSN naming a fresh migrated database of the
test's own, and a 60 s limit. A block whose first line is a comment naming a Python file
(`# myapp/jobs.py`) is also written to that path, so that a later block, or a handler's import, can
import it. A failure names the page, the line where the failing block starts, and what the process
wrote on stderr.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT, wait_for

TIMEOUT = 60.0

# An opening fence of a Python block: ``` or ~~~ (three or more), `python`, then optionally attributes.
_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*python(?:[ \t].*)?$")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line of the block's first line of code, counted from 1; its source) of every ```python block.

    >>> page = "intro\\n```python\\nx = 1\\n```\\n\\n  ```python title='a.py'\\n  y = x\\n  ```\\n"
    >>> python_blocks(page + "```sh\\nls\\n```\\n")
    [(3, 'x = 1\\n'), (7, 'y = x\\n')]
    """
    blocks: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = _OPEN.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        start = i + 1
        i = start
        while i < len(lines) and not closing.match(lines[i]):
            i += 1
        body = [line[indent:] if line[:indent].strip() == "" else line.lstrip() for line in lines[start:i]]
        blocks.append((start + 1, "".join(line + "\n" for line in body)))
        i += 1
    return blocks


def pages(root: Path = ROOT) -> list[Path]:
    """README.md and every page under docs/ that has a ```python block."""
    found = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    return [page for page in found if page.is_file() and python_blocks(page.read_text())]


# Runs in the page's process: argv[1] is a JSON file of [page, [[line, source], ...]].
RUNNER = r"""
import ast, asyncio, inspect, json, os, re, sys, traceback

sys.path.insert(0, os.getcwd())
with open(sys.argv[1]) as f:
    page, blocks = json.load(f)
namespace = {"__name__": "__main__", "__file__": page}
for line, source in blocks:
    print(f"--- the block at line {line}", file=sys.stderr, flush=True)
    named = re.match(r"#\s*([\w.-]+(?:/[\w.-]+)*\.py)\s*$", source.split("\n", 1)[0])
    if named:
        path = os.path.join(os.getcwd(), named[1])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(source)
    try:
        # Blank lines first, so that tracebacks give the page's own line numbers.
        code = compile("\n" * (line - 1) + source, page, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        result = eval(code, namespace)  # a block with a top-level await gives a coroutine to run
        if inspect.iscoroutine(result):
            asyncio.run(result)
    except BaseException:
        traceback.print_exc()
        print(f"{page}: the block at line {line} failed", file=sys.stderr)
        sys.exit(1)
"""


def run_page(page: Path, dsn: str, cwd: Path, timeout: float = TIMEOUT) -> tuple[int | None, str, str]:
    """Run the page's blocks in one fresh process: (exit code, None on a timeout; stdout; stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "JOBSUP_DATA_DIR")}
    env["JOBSUP_DSN"] = dsn
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return run_blocks(page, cwd, env, timeout)


def run_blocks(
    page: Path, cwd: Path, env: dict[str, str], timeout: float, prelude: str = ""
) -> tuple[int | None, str, str]:
    """run_page's process, in `env`, with `prelude` (Python) run before the page's blocks."""
    script = cwd / ".docs_runner.py"
    script.write_text(prelude + RUNNER)
    blocks = cwd / ".docs_blocks.json"
    blocks.write_text(json.dumps([str(page), python_blocks(page.read_text())]))
    process = subprocess.Popen(
        [sys.executable, str(script), str(blocks)],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a block's own processes are stopped with it on a timeout
    )
    try:
        out, err = process.communicate(timeout=timeout)
        return process.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        return None, out, err


def _failed_block(stderr: str) -> str:
    started = re.findall(r"^--- (.*)$", stderr, re.MULTILINE)
    return started[-1] if started else "before its first block"


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_the_python_blocks_of_a_page_run(page: Path, dsn: str, tmp_path: Path):
    code, out, err = run_page(page, dsn, tmp_path)
    name = page.relative_to(ROOT)
    if code is None:
        pytest.fail(f"{name}: timed out after {TIMEOUT:g}s in {_failed_block(err)}\n--- stderr:\n{err}")
    if code != 0:
        pytest.fail(
            f"{name}: {_failed_block(err)} failed (exit {code})\n--- stderr:\n{err}\n--- stdout:\n{out[-2000:]}"
        )


@pytest.mark.slow  # starts a real supervisor
@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_the_first_example_runs_under_a_supervisor_that_imports_it_once_per_worker(
    page: str, dsn: str, start, conn, tmp_path: Path
):
    """The page's script enqueues; the app module that `jobsup start` imports in each worker only
    declares: its workers enqueue nothing more, and a handler serves every job the script enqueued."""
    code, out, err = run_page(ROOT / page, dsn, tmp_path)
    assert code == 0, err
    enqueued = sorted(conn.execute("SELECT id, kind FROM jobsup.jobs").fetchall())
    assert enqueued, out
    sup = start(app="myapp.jobs:app", env={"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])})
    sup.wait_ready()
    done = "SELECT count(*) FROM jobsup.jobs WHERE kind = 'email' AND status = 'done'"
    wait_for(lambda: conn.execute(done).fetchone()[0], 30, message=f"the email sent\n{sup.log()}")
    sup.stop()
    assert sorted(conn.execute("SELECT id, kind FROM jobsup.jobs").fetchall()) == enqueued, sup.log()
    [kinds] = re.findall(r"app\.loaded .* kinds=(\S+)", sup.log())
    assert {kind for _, kind in enqueued} <= set(kinds.split(",")), sup.log()
    assert "Traceback" not in sup.log(), sup.log()


# The collector and the runner themselves, on pages made here.


def test_a_page_without_python_blocks_is_no_case(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("```sh\njobsup start\n```\n")
    (tmp_path / "docs" / "a.md").write_text("# A\n\n```python\nx = 1\n```\n")
    (tmp_path / "docs" / "b.md").write_text("# B\n\n```pycon\n>>> 1\n```\n")
    assert pages(tmp_path) == [tmp_path / "docs" / "a.md"]


def test_blocks_share_names_write_named_files_and_a_failure_names_its_line(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n"
        "\n"
        "```python\n"
        "# pkg/thing.py\n"
        "VALUE = 41\n"
        "```\n"
        "\n"
        "```python\n"
        "import os\n"
        "from pkg.thing import VALUE\n"
        "answer = VALUE + 1\n"
        "assert os.environ['JOBSUP_DSN']\n"
        "```\n"
        "\n"
        "- in a list:\n"
        "\n"
        "    ```python\n"
        "    assert answer == 42\n"
        "    await __import__('asyncio').sleep(0)\n"
        "    1 / 0\n"
        "    ```\n"
    )
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    code, _, err = run_page(page, "postgresql://unused@localhost/none", cwd)
    assert code == 1, err
    assert f"{page}: the block at line 18 failed" in err, err
    assert f'File "{page}", line 20' in err and "ZeroDivisionError" in err, err


@pytest.mark.slow  # waits out the block's 2 s timeout
def test_a_block_that_hangs_is_stopped(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("```python\nimport time\n```\n\n```python\ntime.sleep(120)\n```\n")
    code, _, err = run_page(page, "postgresql://unused@localhost/none", tmp_path, timeout=2)
    assert code is None and _failed_block(err) == "the block at line 6", err
