"""The one boundary between the safety filters and what classifies text."""

from __future__ import annotations

from abc import ABC, abstractmethod

from llmmesh.region.safety.verdict import CheckKind, Verdict


class SafetyBackend(ABC):
    """Classifies one text into moderation categories.

    A backend that cannot decide raises (any ``Exception``); it never returns
    a safe verdict it is unsure of. The filters turn a raise or a timeout into
    ``Unavailable(SAFETY_UNAVAILABLE)``: the mesh fails closed.
    """

    name: str
    """Short name reported in verdicts and error metadata (``rules``, ``judge``)."""

    context_chars: int | None = None
    """How far before a match any of the backend's rules looks (its look-behinds),
    in characters, for :meth:`check` and :meth:`hold_from` alike; ``None``, the
    default, for any distance. The output filter narrows its windows to the
    text still unreleased and this much (and its overlap) before it only where
    every backend bounds it and tells exactly what to hold back."""

    @abstractmethod
    async def check(self, text: str, *, kind: CheckKind) -> Verdict:
        """Classify ``text``; ``kind`` says whether it is the caller's input or
        the model's output (some categories apply to one only)."""

    def check_at_once(self, text: str, *, kind: CheckKind) -> Verdict | None:
        """:meth:`check`'s verdict where the backend reaches it without
        waiting on anything (no I/O, no thread): the filters then take it as
        it is, with no timeout to arm, since nothing could interrupt it
        anyway. ``None``, the default, means :meth:`check` must be awaited
        (within the filters' timeout)."""
        return None

    def hold_from(self, text: str, *, kind: CheckKind, since: int = 0) -> int | None:
        """Where, in ``text`` (a reply so far, its end the newest character
        received), a flag could still begin: the earliest offset ``>= since``
        such that ``text[offset:]`` followed by some text still to come might
        be flagged, a match already whole in ``text`` included; ``len(text)``
        when nothing could. Text before ``since`` was already released and is
        context only.

        It must never answer later than the truth, since the output filter
        releases text up to the answer. ``None``, the default, means this
        backend cannot tell, and the filter holds back its fixed overlap.
        """
        return None
