"""Keyset pagination for list RPCs (AIP-158): a page token names the last key served."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from llmmesh.core.errors import InvalidArgument, Reason

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing; ``next_page_token`` is empty on the last page."""

    items: list[T]
    next_page_token: str = ""


def _encode(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode("utf-8")).decode("ascii")


def _decode(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode("ascii")).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError):
        raise InvalidArgument(
            Reason.INVALID_REQUEST, "malformed page_token", metadata={"param": "page_token"}
        ) from None


def page_window(
    page_size: int, page_token: str, *, default_size: int = 50, max_size: int = 500
) -> tuple[str | None, int]:
    """The key a page starts after (``None`` for the first page) and its size.

    ``page_size`` 0 means ``default_size``; larger than ``max_size`` is
    clamped; negative is INVALID_ARGUMENT, as is a malformed token.
    """
    if page_size < 0:
        raise InvalidArgument(
            Reason.INVALID_REQUEST, "page_size must be >= 0", metadata={"param": "page_size"}
        )
    return (_decode(page_token) if page_token else None), min(page_size or default_size, max_size)


def page_of(candidates: list[T], key: Callable[[T], str], size: int) -> Page[T]:
    """The page made of the first ``size`` of ``candidates`` (in key order, up to ``size + 1`` of them)."""
    page = candidates[:size]
    more = len(candidates) > size
    return Page(page, _encode(key(page[-1])) if more and page else "")


def paginate(
    items: Iterable[T],
    key: Callable[[T], str],
    page_size: int,
    page_token: str,
    *,
    default_size: int = 50,
    max_size: int = 500,
) -> Page[T]:
    """The page of ``items`` (ordered by ``key``, which must be unique) after ``page_token``.

    Keyset tokens stay correct when items are added between calls: nothing is
    skipped or served twice. Sizes as in :func:`page_window`.
    """
    after, size = page_window(page_size, page_token, default_size=default_size, max_size=max_size)
    ordered = sorted(items, key=key)
    if after is not None:
        ordered = [item for item in ordered if key(item) > after]
    return page_of(ordered[: size + 1], key, size)
