"""The safety filters a chat turn passes through: :class:`InputFilter` before
any engine work, :class:`StreamingOutputFilter` on the reply as it streams.

Both fail closed. A backend that raises or does not answer within
``timeout_s`` ends the turn with ``Unavailable(SAFETY_UNAVAILABLE)`` (with
RetryInfo), never with a silent pass: an outage of the safety path must not
become a window in which unfiltered text reaches callers. The cost is
availability, which is the right side to err on for a filter, and clients
already retry ``UNAVAILABLE``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from typing import NamedTuple

from llmmesh.core.errors import PermissionDenied, Reason, Unavailable
from llmmesh.region import metrics as region_metrics
from llmmesh.region.safety.backend import SafetyBackend
from llmmesh.region.safety.verdict import PII, CheckKind, Verdict

log = logging.getLogger(__name__)

WORD_SLACK = 32
"""How far a window may stretch so as not to cut a word at its edges."""


async def screen(
    backends: Sequence[SafetyBackend],
    text: str,
    *,
    kind: CheckKind,
    timeout_s: float,
    retry_after_s: float,
) -> Verdict | None:
    """The first flagged verdict of ``backends`` (asked in order, cheap ones
    first, each within ``timeout_s``), or ``None`` when all pass.

    Raises ``Unavailable(SAFETY_UNAVAILABLE)`` when a backend raises or times
    out; a flag from an earlier backend wins, since it needs no retry. A
    backend that decides at once (:meth:`SafetyBackend.check_at_once`) is
    taken without a timer: no timeout could interrupt it.
    """
    for backend in backends:
        try:
            verdict = backend.check_at_once(text, kind=kind)
            if verdict is None:
                async with asyncio.timeout(timeout_s):
                    verdict = await backend.check(text, kind=kind)
        except Exception as exc:
            log.warning("safety backend %s failed on %s: %r", backend.name, kind, exc)
            raise Unavailable(
                Reason.SAFETY_UNAVAILABLE,
                f"the safety check ({backend.name}) is unavailable: {type(exc).__name__}",
                metadata={"backend": backend.name},
                retry_after_s=retry_after_s,
            ) from exc
        if verdict.reported:
            log.info("safety %s reported %s (%s)", kind, ",".join(verdict.reported), verdict.backend)
        if verdict.flagged:
            return verdict
    return None


class InputFilter:
    """Checks a turn's messages before any engine work."""

    def __init__(
        self, backends: Sequence[SafetyBackend], *, timeout_s: float = 5.0, retry_after_s: float = 1.0
    ) -> None:
        self._backends = tuple(backends)
        self._timeout_s = timeout_s
        self._retry_after_s = retry_after_s

    async def check(self, messages: Sequence[tuple[str, str]]) -> None:
        """Pass, or raise ``PermissionDenied(CONTENT_FILTERED)`` with the
        blocking ``categories`` (comma-separated) and ``backend`` as metadata.

        Every role is checked, the system prompt included, as one text so a
        phrase cannot hide by being split across messages.
        """
        text = "\n\n".join(content for _, content in messages if content)
        if not text:
            return
        verdict = await screen(
            self._backends, text, kind="input", timeout_s=self._timeout_s, retry_after_s=self._retry_after_s
        )
        if verdict is not None:
            region_metrics.safety_blocked("input", verdict.categories)
            categories = ",".join(verdict.categories)
            raise PermissionDenied(
                Reason.CONTENT_FILTERED,
                f"the request was blocked by the content filter ({categories})",
                metadata={"categories": categories, "backend": verdict.backend},
            )

    async def screen_excerpts(self, texts: Sequence[str]) -> list[tuple[str, ...]]:
        """For each of ``texts`` (excerpts of the tenant's own documents that
        would enter a prompt), the blocking categories it must be left out
        for; empty for one that may go in. Every backend is asked, as for the
        turn's messages, but personal data alone keeps an excerpt: the
        documents are the tenant's, and the output filter still screens the
        reply. A prompt injection, a deny-listed term or a configured pattern
        leaves it out. Fails closed as :meth:`check` does."""
        found: list[tuple[str, ...]] = []
        for text in texts:
            blocking: tuple[str, ...] = ()
            for backend in self._backends:
                verdict = await screen(
                    [backend],
                    text,
                    kind="input",
                    timeout_s=self._timeout_s,
                    retry_after_s=self._retry_after_s,
                )
                if verdict is not None:
                    blocking += tuple(c for c in verdict.categories if c != PII and c not in blocking)
            if blocking:
                region_metrics.safety_blocked("retrieval", blocking)
            found.append(blocking)
        return found


class OutputDecision(NamedTuple):
    """What the caller may send on: ``release`` (text checked clean). When
    ``stopped`` is set, nothing more is ever released: the caller aborts the
    engine request and ends the turn with finish reason ``content_filter``.
    A named tuple: one is made for every delta."""

    release: str
    stopped: Verdict | None = None


class StreamingOutputFilter:
    """Checks a streamed reply in overlapping windows and releases only text
    that was checked, and of that only what text still to come cannot turn
    into part of a flag.

    Each check covers up to ``window_chars`` ending at the newest text, and
    consecutive windows overlap by at least ``overlap_chars``. After a clean
    check, every backend says from where a match could still begin
    (:meth:`SafetyBackend.hold_from`, given the text received since the last
    window began): text before the earliest of those goes out, checked or
    not (no match can begin in it, whatever follows), so a reply whose end
    could not start a flagged phrase is released at once. A backend that
    cannot tell (a model judge) holds back the last ``overlap_chars``
    checked until the next window (or :meth:`finish`) has seen them with
    what follows, and nothing past the checked end. Either way a flagged phrase the windows can
    see whole (any of up to ``overlap_chars``) is caught before any part of
    it is released, however the deltas split it.
    Windows begin and end at word edges (stretching by up to ``WORD_SLACK``),
    so a whole-word rule never fires on a fragment (``ass`` of
    ``assassin``); a word still unfinished is released before its window only
    where no rule can begin in it.

    A check runs once ``min_check_chars`` unchecked characters have arrived:
    ``1`` checks on every delta (fine for :class:`RulesBackend`), while
    ``window_chars - overlap_chars`` checks only full windows (for a model
    judge), at the cost of releasing text in larger steps.

    One turn, one instance; calls must not overlap. Backend failures raise
    ``Unavailable(SAFETY_UNAVAILABLE)`` from this and every later call.
    """

    def __init__(
        self,
        backends: Sequence[SafetyBackend],
        window_chars: int = 256,
        overlap_chars: int = 64,
        *,
        min_check_chars: int = 1,
        timeout_s: float = 5.0,
        retry_after_s: float = 1.0,
    ) -> None:
        if not 0 <= overlap_chars < window_chars:
            raise ValueError("need 0 <= overlap_chars < window_chars")
        if not 1 <= min_check_chars <= window_chars - overlap_chars:
            raise ValueError("need 1 <= min_check_chars <= window_chars - overlap_chars")
        self._backends = tuple(backends)
        self._window = window_chars
        self._overlap = overlap_chars
        self._min_check = min_check_chars
        self._timeout_s = timeout_s
        self._retry_after_s = retry_after_s
        # The stream from absolute offset _base on; everything before it was
        # released and is outside any future window.
        self._text = ""
        self._base = 0
        self._checked = 0  # end of the last window checked clean
        self._window_start = 0  # and where it began
        self._released = 0
        # Every backend said exactly, at the last release, where a match could still begin.
        self._exact = False
        # How far before a match every backend's rules look, if all bound it.
        contexts = [c for backend in self._backends if (c := backend.context_chars) is not None]
        self._context = max([overlap_chars, *contexts]) if len(contexts) == len(self._backends) else None
        self._stopped: Verdict | None = None
        self._failure: Unavailable | None = None
        self._finished = False

    @property
    def held(self) -> str:
        """Text received but not yet released."""
        return self._text[self._released - self._base :]

    @property
    def stopped(self) -> Verdict | None:
        """The verdict that stopped the stream, if one did."""
        return self._stopped

    async def feed(self, delta: str) -> OutputDecision:
        """Take the next text delta; release what is now checked."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        if self._stopped is None and self._failure is None:
            self._text += delta
        return await self._advance(final=False)

    async def finish(self) -> OutputDecision:
        """The reply ended: check the rest and release it all if clean."""
        self._finished = True
        return await self._advance(final=True)

    async def _advance(self, *, final: bool) -> OutputDecision:
        if self._failure is not None:
            raise self._failure
        if self._stopped is not None:
            return OutputDecision("", self._stopped)
        end = self._base + len(self._text)
        while end > self._checked and (final or end - self._checked >= self._min_check):
            # A step that reaches the end: its stop is the last edge up to the
            # end (see _next_stop), so after its check none is left to stop at.
            last_step = end <= self._checked + self._window - self._overlap
            stop = self._next_stop(end, final)
            if stop is None:
                break
            start = self._word_start(max(0, self._window_floor(stop)))
            window = self._text[start - self._base : stop - self._base]
            try:
                verdict = await screen(
                    self._backends,
                    window,
                    kind="output",
                    timeout_s=self._timeout_s,
                    retry_after_s=self._retry_after_s,
                )
            except Unavailable as err:
                self._failure = err
                raise
            if verdict is not None:
                self._stopped = verdict
                return OutputDecision("", verdict)
            self._checked, self._window_start = stop, start
            if last_step:
                break
        upto = end if final else max(self._released, self._clear_end(end))
        release = self._text[self._released - self._base : upto - self._base]
        self._released = upto
        # Drop what no future window reaches (see _advance and _word_start).
        keep = min(self._released, self._checked - self._window - WORD_SLACK - 1)
        keep = max(self._base, keep)
        self._text = self._text[keep - self._base :]
        self._base = keep
        return OutputDecision(release)

    def _clear_end(self, end: int) -> int:
        """Where text stops being safe to release: the earliest point from
        which any backend says a match could still begin, or the overlap back
        from the checked end for one that cannot tell. Where every backend
        can tell, that point may lie past the checked end: text no match can
        ever begin in (nor include, whatever follows) is released before a
        window ends after it, so a first token that cannot start a flag goes
        out with its own step instead of waiting for the next token to end
        its word. The backends see the text from the last window's start
        (the context its check had), so their work is bounded by the window,
        not the reply."""
        start = self._window_start
        text = self._text[start - self._base : end - self._base]
        since = max(0, self._released - start)
        clear = end
        exact = True
        for backend in self._backends:
            hold = _hold_from(backend, text, since)
            exact = exact and hold is not None
            clear = min(clear, self._checked - self._overlap if hold is None else start + hold)
        self._exact = exact
        return clear

    def _window_floor(self, stop: int) -> int:
        """Where the window ending at ``stop`` begins (before moving out of a
        word): ``window_chars`` back, and at least the overlap before the
        checked end.

        Where every backend bounds how far its rules look back
        (:attr:`SafetyBackend.context_chars`) and told exactly where a match
        could still begin when text was last released, no match can begin
        in the released text, whatever follows, but for an email address's
        local part (held from its ``@``, see :meth:`RulesBackend.hold_from`):
        the window then begins that look-back, or the overlap if longer,
        before the released point (or the checked end, if that is earlier).
        It holds all a rule reads of what can still match, a local part up
        to the overlap whole (a longer one's tail still reads as an
        address), and the backends decide on it as on the whole window; a
        check then reads the text still unreleased and a few dozen
        characters, not the whole window."""
        floor = min(stop - self._window, self._checked - self._overlap)
        if self._exact and self._context is not None:
            floor = max(floor, min(self._checked, self._released) - self._context)
        return floor

    def _next_stop(self, end: int, final: bool) -> int | None:
        """Where the next window ends: at most a step past the last one, and
        at a word edge, so that a window never ends inside a word whose rest
        has not been seen (``ass`` in ``assassin``, split by tokens). A word
        may stretch the step by ``WORD_SLACK``; a longer one is cut. ``None``:
        wait for more text."""
        limit = self._checked + self._window - self._overlap
        stop = self._last_edge(min(end, limit), end, final)
        if stop is not None:
            return stop
        for stop in range(limit + 1, min(end, limit + WORD_SLACK) + 1):
            if self._is_edge(stop, end, final):
                return stop
        return limit if end >= limit + WORD_SLACK else None

    def _last_edge(self, high: int, end: int, final: bool) -> int | None:
        """The last word edge after the checked end and at most ``high``
        (:meth:`_is_edge` of each, from ``high`` down, in one search): a
        position is an edge where the character before it or at it is no
        word character, and the end where the reply is final or its last
        character is no word character."""
        if high == end and high > self._checked and self._is_edge(end, end, final):
            return end
        # The characters an edge up to the last one before ``end`` can turn on.
        last = high if high < end else end - 1
        found = _LAST_NON_WORD.match(self._text, self._checked - self._base, last - self._base + 1)
        if found is None:
            return None
        at = found.start(1) + self._base
        return at + 1 if at + 1 <= last else (at if at > self._checked else None)

    def _is_edge(self, pos: int, end: int, final: bool) -> bool:
        before = self._text[pos - 1 - self._base]
        if pos == end:
            return final or not _is_word(before)
        return not (_is_word(before) and _is_word(self._text[pos - self._base]))

    def _word_start(self, start: int) -> int:
        """``start`` moved back (by at most ``WORD_SLACK``) out of a word, so
        that a window never begins with the tail of a word (``ass`` of
        ``embarrass``)."""
        floor = max(self._base + 1, start - WORD_SLACK)
        while start >= floor and _is_word(self._text[start - 1 - self._base]):
            if not _is_word(self._text[start - self._base]):
                break
            start -= 1
        return start


def _hold_from(backend: SafetyBackend, text: str, since: int) -> int | None:
    """``backend.hold_from``, with a failure taken for "cannot tell": holding
    back the overlap is safe, so a bug here costs latency, not the turn."""
    try:
        return backend.hold_from(text, kind="output", since=since)
    except Exception:
        log.exception("safety backend %s could not tell what to hold back", backend.name)
        return None


# The last character that is no word character (``\\W``: neither
# ``str.isalnum`` nor ``_``, as :func:`_is_word` reads it).
_LAST_NON_WORD = re.compile(r".*(\W)", re.DOTALL)


def _is_word(char: str) -> bool:
    # What the regex engine's \w matches, near enough for word edges.
    return char.isalnum() or char == "_"
