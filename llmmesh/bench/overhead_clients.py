"""The two clients of ``llmmesh bench overhead`` and what they share.

``direct``: :class:`~llmmesh.bench.grpc_client.EngineGrpcClient` on the
engine pod's ``EngineService.Generate`` stream; its time to first token
ends at the first ``delta`` event. ``mesh``:
:class:`~llmmesh.bench.overhead_sse.SseChatClient` on the edge's streamed
``POST /v1/chat/completions``; its time to first token ends at the first
chunk with content (the role chunk the edge sends first carries no
token). An edge chunk says its text, not its tokens; the simulator's output
is whole vocabulary pieces, which its tokenizer encodes back to exactly the
tokens generated, so :class:`SimChunkCounter` counts each chunk's tokens
from its text, and the final usage chunk settles any difference.

:class:`ArrivalJitter` delays each request a seeded random time before the
client sends it (outside its TTFT), for all systems alike, stratified over
each round.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from engine.sim.tokenizer import SimTokenizer
from llmmesh.bench.loadgen import StreamingClient
from llmmesh.bench.openai_client import ChunkCounter
from llmmesh.bench.stats import RequestRecord
from llmmesh.bench.workload import ChatRequest


class SimChunkCounter(ChunkCounter):
    """Output tokens of one edge stream, counted from each chunk's text in
    the simulator's tokens; a chunk with ``usage`` adds what its total has
    over the tokens counted so far."""

    _tokenizer = SimTokenizer()

    def tokens_in(self, chunk: dict[str, Any]) -> int:
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            return super().tokens_in(chunk)
        choices = chunk.get("choices") or []
        text = "".join((choice.get("delta") or {}).get("content") or "" for choice in choices)
        added = len(self._tokenizer.encode(text)) if text else 0
        self.counted += added
        return added


class ArrivalJitter:
    """Sends each request through ``client`` after a random delay in
    ``[0, max_delay_s)``, drawn from ``seed``; the delay is not part of the
    request's record (its clock starts when the client sends).

    :meth:`deal` stratifies a round's delays: of ``count`` requests, one
    delay falls in each ``1/count`` of the range, in a seeded random order.
    A busy pod's step clock turns each delay into the phase at which the
    request arrives, and the wait for the next step boundary is most of the
    spread of a time to first token; with stratified delays every system
    sees the same spread of phases in a round, whatever its own latency
    shifts them by, where independent draws leave each system's median to
    chance by up to a step's share of ``1/sqrt(count)``. Outside a dealt
    round each delay is drawn uniformly."""

    def __init__(self, client: StreamingClient, max_delay_s: float, seed: str) -> None:
        self._client = client
        self._max_delay_s = max_delay_s
        self._seed = seed
        self._rng = random.Random(seed)
        self._dealt: list[float] = []

    def deal(self, round_name: str, count: int) -> None:
        """The next ``count`` delays, stratified and shuffled from the seed
        and ``round_name``: every client dealt the same round draws the same."""
        rng = random.Random(f"{self._seed}/{round_name}")
        delays = [(k + rng.random()) / count * self._max_delay_s for k in range(count)]
        rng.shuffle(delays)
        self._dealt = delays[::-1]

    def _delay(self) -> float:
        if self._dealt:
            return self._dealt.pop()
        return self._rng.uniform(0.0, self._max_delay_s)

    async def generate(self, request: ChatRequest) -> RequestRecord:
        if self._max_delay_s > 0:
            await asyncio.sleep(self._delay())
        return await self._client.generate(request)

    async def close(self) -> None:
        await self._client.close()
