"""A turn's engine deltas through the streaming output filter.

The filter releases text once it was checked and nothing still to come can
make it part of a flag (:class:`region.safety.StreamingOutputFilter`), for
clean text mostly as soon as the word it ends in is complete; text and
tokens must stay together for the client (a continuation after failover
resumes from the token ids delivered), so deltas are held whole and go out
merged once all of their text is released. Text the filter released in the middle of a
delta waits for the rest of that delta.

A delta's tool-call parts are read by the filter too (their names and
argument text, :func:`region.turn.tool_calls.part_text`, after the delta's
content): a flagged phrase inside a call's arguments stops the reply as one
in its content does. They go out with their delta, as do its logprobs.

A continuation's filter is first seeded with the tail of the text the client
already has (:meth:`FilteredOutput.seed`), so a flagged phrase that began
before the break is caught when its rest arrives; the seed itself is never
delivered again.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from llmmesh.region.safety import OutputDecision, StreamingOutputFilter, Verdict
from llmmesh.region.turn.tool_calls import merge_parts, part_text
from llmmesh.v1 import common_pb2

SEED_CHARS = 1024
"""How much of a continuation's delivered text seeds its filter: far more than a filter's overlap."""


class Release(NamedTuple):
    """Deltas now cleared for the client, merged (empty when none are); a
    named tuple, as one is made for every delta."""

    text: str
    token_ids: tuple[int, ...]
    tool_calls: tuple[common_pb2.ToolCallDelta, ...] = ()
    logprobs: tuple[common_pb2.TokenLogprob, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.text or self.token_ids or self.tool_calls)


_NOTHING = Release("", ())


class _Held(NamedTuple):
    """One delta waiting for the filter; ``checked`` is how much filter text it is."""

    checked: int
    release: Release


class FilteredOutput:
    """Holds a turn's deltas until the filter (None: no filter) clears them."""

    def __init__(self, output_filter: StreamingOutputFilter | None) -> None:
        self._filter = output_filter
        self._held: deque[_Held] = deque()
        # Characters of held text the filter has released.
        self._cleared = 0

    @property
    def stopped(self) -> Verdict | None:
        return self._filter.stopped if self._filter is not None else None

    @property
    def held_tokens(self) -> int:
        """Tokens received and not (yet) delivered."""
        return sum(len(held.release.token_ids) for held in self._held)

    async def seed(self, delivered: str) -> None:
        """Let the filter see the end of text delivered before (a
        continuation's), as context for what follows; none of it is released
        again. Starts at a word edge, so no rule sees a word's tail alone."""
        if self._filter is None or not delivered:
            return
        tail = delivered[-SEED_CHARS:]
        if len(tail) < len(delivered):
            cut = next((i for i, char in enumerate(tail) if not (char.isalnum() or char == "_")), len(tail))
            tail = tail[cut:]
        # Released seed text is not a held delta: count it off first.
        self._cleared -= len(tail)
        self._take(await self._filter.feed(tail))

    async def feed(
        self,
        text: str,
        token_ids: tuple[int, ...],
        tool_calls: tuple[common_pb2.ToolCallDelta, ...] = (),
        logprobs: tuple[common_pb2.TokenLogprob, ...] = (),
    ) -> Release:
        """Take the next engine delta; raises Unavailable when the filter fails."""
        delta = Release(text, token_ids, tool_calls, logprobs)
        if self._filter is None:
            return delta
        checked = text + part_text(tool_calls) if tool_calls else text
        self._held.append(_Held(len(checked), delta))
        return self._take(await self._filter.feed(checked))

    async def finish(self) -> Release:
        """The engine finished: check and clear what is held."""
        if self._filter is None:
            return _NOTHING
        return self._take(await self._filter.finish())

    def _take(self, decision: OutputDecision) -> Release:
        if decision.stopped is not None:
            return _NOTHING
        self._cleared += len(decision.release)
        held = self._held
        if not held or held[0].checked > self._cleared:
            return _NOTHING
        released: list[Release] = []
        while held and held[0].checked <= self._cleared:
            checked, release = held.popleft()
            self._cleared -= checked
            released.append(release)
        return merge(released)


def merge(deltas: list[Release]) -> Release:
    """Deltas as one, in order (adjacent parts of one tool call folded)."""
    if len(deltas) == 1:
        return deltas[0]
    parts = [part for delta in deltas for part in delta.tool_calls]
    return Release(
        "".join(delta.text for delta in deltas),
        tuple(i for delta in deltas for i in delta.token_ids),
        tuple(merge_parts(parts)),
        tuple(entry for delta in deltas for entry in delta.logprobs),
    )
