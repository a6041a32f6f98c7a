"""A conversation's messages as a tree: each message follows its parent.

Editing a user message or regenerating a reply adds a sibling, so a
conversation holds branches: the paths from its first messages to its
leaves (messages nothing follows yet). The **current branch** is the one
ending at the newest message (the highest ``seq``): the branch last
written to, which a turn naming no branch point continues.

A parent always has a lower ``seq`` than its children, so a path read
from the leaf up and reversed is in ``seq`` order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from llmmesh.region.zone_store.rows import MessageRow


@dataclass(frozen=True)
class BranchRow:
    """One branch: its leaf, its length, where it forked from an older
    branch ("" when it shares no message with one) and whether it is current."""

    leaf_id: str
    message_count: int
    fork_id: str
    updated_at: datetime
    current: bool


def current_leaf(rows: Sequence[MessageRow]) -> str:
    """The id of the newest message ("" for an empty conversation)."""
    return max(rows, key=lambda row: row.seq).id if rows else ""


def path_to(rows: Sequence[MessageRow], leaf_id: str) -> list[MessageRow]:
    """The messages from the first to ``leaf_id``, in order; [] for "".

    KeyError when ``leaf_id`` is not one of ``rows``.
    """
    by_id = {row.id: row for row in rows}
    path: list[MessageRow] = []
    at = leaf_id
    # Bounded: a well-formed tree has no path longer than its messages.
    for _ in range(len(rows)):
        if not at:
            break
        row = by_id[at]
        path.append(row)
        at = row.parent_id
    path.reverse()
    return path


def current_branch(rows: Sequence[MessageRow]) -> list[MessageRow]:
    """The current branch's messages, in order."""
    return path_to(rows, current_leaf(rows))


def branches(rows: Sequence[MessageRow]) -> list[BranchRow]:
    """Every branch, newest leaf first."""
    parents = {row.parent_id for row in rows}
    leaves = sorted((row for row in rows if row.id not in parents), key=lambda row: row.seq)
    current = current_leaf(rows)
    paths = {leaf.id: [m.id for m in path_to(rows, leaf.id)] for leaf in leaves}
    found: list[BranchRow] = []
    for i, leaf in enumerate(leaves):
        mine = paths[leaf.id]
        shared = max((_common(mine, paths[older.id]) for older in leaves[:i]), default=0)
        fork = mine[shared - 1] if shared else ""
        found.append(BranchRow(leaf.id, len(mine), fork, leaf.created_at, leaf.id == current))
    found.reverse()
    return found


def _common(one: Sequence[str], other: Sequence[str]) -> int:
    n = 0
    for a, b in zip(one, other, strict=False):
        if a != b:
            break
        n += 1
    return n
