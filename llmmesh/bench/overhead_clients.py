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
each round. :class:`TraceSampling` has the traced mesh trace half of each
round's requests.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from llmmesh.bench.loadgen import LevelRun, StreamingClient
from llmmesh.bench.openai_client import ChunkCounter
from llmmesh.bench.stats import RequestRecord
from llmmesh.bench.workload import ChatRequest
from llmmesh.engine.sim.tokenizer import SimTokenizer


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

    def deal(self, round_name: str, count: int) -> list[float]:
        """The next ``count`` delays, stratified and shuffled from the seed
        and ``round_name``: every client dealt the same round draws the
        same. Returns them in the order the round's requests draw them
        (request order: a closed loop sends its requests in order)."""
        rng = random.Random(f"{self._seed}/{round_name}")
        delays = [(k + rng.random()) / count * self._max_delay_s for k in range(count)]
        rng.shuffle(delays)
        self._dealt = delays[::-1]
        return delays

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


class TraceSampling:
    """Which requests of a round the traced mesh traces: :meth:`deal`
    marks half of a round's requests sampled and the other half not;
    :meth:`flags` is the W3C trace flags each request carries (``01``
    sampled, ``00`` not). A request outside a dealt round (a warm-up, a
    round's first) is sampled.

    Both halves share one mesh, one round, the same load, so what
    separates their times to first token is what tracing a turn adds on
    its path, not what differs between two meshes or two rounds. The
    halves also share the arrival delays: the requests are paired by
    their delay's rank (the two shortest, the next two...) and one of each
    pair, drawn from the seed, is sampled. A request's delay sets where in
    the busy pod's step cycle it arrives, and the wait for the next step is
    most of the spread of its time to first token; with paired delays both
    halves see the same spread."""

    def __init__(self, seed: str) -> None:
        self._seed = seed
        self._sampled: dict[int, bool] = {}

    def deal(self, round_name: str, requests: Sequence[ChatRequest], delays: Sequence[float]) -> list[bool]:
        """Mark ``requests`` (a round, in order, whose arrival delays are
        ``delays``) sampled or not, half each; return the marks in order."""
        if len(delays) != len(requests):
            raise ValueError(f"{len(delays)} delays for a round of {len(requests)} requests")
        rng = random.Random(f"{self._seed}/{round_name}")
        by_delay = sorted(range(len(requests)), key=lambda index: delays[index])
        marks = [False] * len(requests)
        for start in range(0, len(by_delay), 2):
            pair = by_delay[start : start + 2]
            marks[pair[rng.randrange(len(pair))]] = True
        self._sampled = {id(request): mark for request, mark in zip(requests, marks, strict=True)}
        return marks

    def flags(self, request: ChatRequest) -> str:
        return "01" if self._sampled.get(id(request), True) else "00"


def split_run(run: LevelRun, marks: Sequence[bool]) -> tuple[LevelRun, LevelRun]:
    """A round's run split by ``marks`` (:meth:`TraceSampling.deal`) into
    its sampled and its unsampled requests. Each part's wall time is the
    round's in proportion to its share of the requests, so that its
    throughput stays the round's rate."""
    if len(marks) != len(run.records):
        raise ValueError(f"{len(marks)} marks for a round of {len(run.records)} requests")
    parts = []
    for wanted in (True, False):
        records = [record for record, mark in zip(run.records, marks, strict=True) if mark is wanted]
        parts.append(LevelRun(records, run.wall_s * len(records) / max(1, len(run.records))))
    return parts[0], parts[1]
