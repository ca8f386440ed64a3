"""A workflow as a tree of its jobs, each under its first parent, with a wide fan-out of siblings of one
kind folded into one line: the one tree that `jobsup workflow` prints and the console draws, each with a
fold width of its own. Pure: no textual, no database (the callers draw the lines).

A job with several parents appears once, under the first of them (the lowest id) that belongs to the
workflow; its line says how many more it waits for. A job with no parent in the workflow is a root. When
more than `fanout` siblings share a kind, they are one line ("50 × parse") whose children are all of
theirs: a fan-in after a fan-out (50 parse jobs, then one report) reads as scan → 50 × parse → report,
not as a report hidden under the first of fifty parse jobs. Such a line can be expanded, by its key.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from jobsup.ops.workflows import Member, WorkflowView

MAX_INDENT = 8  # levels of indentation drawn; a deeper line keeps the last ones, marked with "…"
# The statuses in the order a job goes through them, as `jobsup workflow` counts them.
STATUSES = ("waiting", "queued", "running", "done", "dead", "cancelled")
ENDED = frozenset({"done", "dead", "cancelled"})


@dataclass(frozen=True)
class Line:
    """One line of the tree: a job (`members` holds it alone) or a fold of same-kind siblings."""

    key: str  # the row's key: a job's id, or "fold:" and the fold's path (stable across refreshes)
    prefix: str  # the branches drawn before it: "│  ├─ " (the outermost cut off past MAX_INDENT levels)
    members: tuple[Member, ...]
    depth: int = 0  # levels below a root, however deep (the prefix stops growing, this does not)
    under: int | None = None  # a job's first parent in the workflow: the one it is drawn under
    folded: bool = False  # a line standing for several siblings (expanded or not)
    expanded: bool = False
    more_parents: int = 0  # a job's parents in the workflow besides the one it is drawn under
    outside_parents: int = 0  # a job's parents outside the workflow (an `after=` id)

    @property
    def job(self) -> Member | None:
        return None if self.folded else self.members[0]

    @property
    def kind(self) -> str:
        return self.members[0].kind

    def counts(self) -> Counter[str]:
        return Counter(m.status for m in self.members)


@dataclass
class _Fold:
    key: str
    members: list[Member] = field(default_factory=list)


def tree(view: WorkflowView, expanded: Collection[str] = (), *, fanout: int) -> list[Line]:
    """The lines of a workflow's tree, top to bottom: more than `fanout` siblings of one kind are one fold;
    `expanded` holds the keys of the folds to open.

    >>> from datetime import datetime, timezone
    >>> t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    >>> def m(i, kind, status, parents=()):
    ...     return Member(i, kind, status, 1, 3, t, None, None, None, 0, list(parents))
    >>> members = [m(1, "scan", "done"), *(m(i, "parse", "done" if i < 5 else "waiting", [1]) for i in range(2, 9))]
    >>> members.append(m(9, "report", "waiting", range(2, 9)))
    >>> view = WorkflowView(7, "ingest", t, None, None, members)
    >>> for line in tree(view, fanout=5):
    ...     more = f" (after {line.more_parents} more)" if line.more_parents else ""
    ...     print(line.prefix + (f"{len(line.members)} × {line.kind}" if line.folded else line.key) + more)
    1
    └─ 7 × parse
       └─ 9 (after 6 more)
    >>> [line.prefix + line.key for line in tree(view, {"fold:1/parse"}, fanout=5)][:4]
    ['1', '└─ fold:1/parse', '   ├─ 2', '   │  └─ 9']
    """
    inside = {m.id for m in view.members}
    under: dict[int | None, list[Member]] = {}
    for m in view.members:
        under.setdefault(_first_parent(m, inside), []).append(m)
    lines: list[Line] = []
    placed: set[int] = set()
    _walk(under.get(None, []), "root", under, inside, expanded, fanout, lines, placed)
    # A job is placed from the roots down, unless its parents form a cycle the schema refuses anyway:
    # shown as roots rather than lost.
    rest = [m for m in view.members if m.id not in placed]
    if rest:
        _walk(rest, "rest", under, inside, expanded, fanout, lines, placed)
    return lines


def _first_parent(m: Member, inside: set[int]) -> int | None:
    return next((p for p in m.parents if p in inside), None)


def _entries(siblings: Sequence[Member], key: str, fanout: int) -> list[Member | _Fold]:
    """Siblings in id order, those of a kind with more than `fanout` of them as one fold at the place of
    the first of them."""
    by_kind = Counter(m.kind for m in siblings)
    folds: dict[str, _Fold] = {}
    entries: list[Member | _Fold] = []
    for m in sorted(siblings, key=lambda m: m.id):
        if by_kind[m.kind] <= fanout:
            entries.append(m)
            continue
        fold = folds.get(m.kind)
        if fold is None:
            fold = folds[m.kind] = _Fold(f"fold:{key.removeprefix('fold:')}/{m.kind}")
            entries.append(fold)
        fold.members.append(m)
    return entries


def _walk(
    siblings: Sequence[Member],
    key: str,
    under: dict[int | None, list[Member]],
    inside: set[int],
    expanded: Collection[str],
    fanout: int,
    lines: list[Line],
    placed: set[int],
) -> None:
    """Depth first, with a stack of its own: a chain of thousands of jobs is as deep as it is long."""
    room = 3 * MAX_INDENT
    # Each level: the entries still to draw (the next one last), and the branches drawn before them (the
    # innermost `room` cells: no more is ever drawn); None for the roots, which have no branch.
    stack: list[tuple[list[Member | _Fold], str | None, int]] = [(_pending(siblings, key, fanout), None, 0)]
    while stack:
        pending, indent, depth = stack[-1]
        if not pending:
            stack.pop()
            continue
        entry = pending.pop()
        branch, carry = ("└─ ", "   ") if not pending else ("├─ ", "│  ")
        drawn = "" if indent is None else _indent(indent + branch)
        below = "" if indent is None else (indent + carry)[-room:]
        if isinstance(entry, _Fold):
            fresh = [m for m in entry.members if m.id not in placed]
            if not fresh:
                continue
            is_open = entry.key in expanded
            lines.append(Line(entry.key, drawn, tuple(fresh), depth, folded=True, expanded=is_open))
            if is_open:  # its members below it, each as itself
                stack.append(([*reversed(fresh)], below, depth + 1))
            else:
                placed.update(m.id for m in fresh)
                children = [c for m in fresh for c in under.get(m.id, []) if c.id not in placed]
                stack.append((_pending(children, entry.key, fanout), below, depth + 1))
            continue
        if entry.id in placed:
            continue
        placed.add(entry.id)
        in_workflow = sum(p in inside for p in entry.parents)
        lines.append(
            Line(
                str(entry.id),
                drawn,
                (entry,),
                depth,
                _first_parent(entry, inside),
                more_parents=max(0, in_workflow - 1),
                outside_parents=len(entry.parents) - in_workflow,
            )
        )
        children = [c for c in under.get(entry.id, []) if c.id not in placed]
        if children:
            stack.append((_pending(children, str(entry.id), fanout), below, depth + 1))


def _pending(siblings: Sequence[Member], key: str, fanout: int) -> list[Member | _Fold]:
    return list(reversed(_entries(siblings, key, fanout)))


def _indent(prefix: str) -> str:
    """The branches of a line, the outermost cut off beyond MAX_INDENT levels (three cells a level).

    >>> _indent("│  " * 10 + "└─ ")[:4], len(_indent("│  " * 10 + "└─ ")) == 3 * MAX_INDENT + 1
    ('…│  ', True)
    """
    room = 3 * MAX_INDENT
    return prefix if len(prefix) <= room else "…" + prefix[-room:]
