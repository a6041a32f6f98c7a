"""Reading every page of an AIP-158 list call."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


async def collect_pages(fetch: Callable[[str], Awaitable[tuple[Sequence[T], str]]]) -> list[T]:
    """All items: ``fetch(page_token)`` returns one page and the next token,
    empty on the last page."""
    items: list[T] = []
    token = ""
    while True:
        page, token = await fetch(token)
        items.extend(page)
        if not token:
            return items
