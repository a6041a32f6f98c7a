"""A benchmark client of an OpenAI-compatible server (``vllm serve``):
streamed ``POST /v1/chat/completions``, server-sent events parsed as they
arrive.

Tokens per chunk come from ``stream_options.continuous_usage_stats``: vLLM
then puts the running ``usage.completion_tokens`` on every chunk, so a
chunk's token count is the difference, exact even when the detokenizer
holds text back. A server that sends no usage falls back to one token per
chunk with content.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

from llmmesh.bench.stats import RequestRecord
from llmmesh.bench.workload import ChatRequest

_DATA = "data:"
_DONE = "[DONE]"


def streamed_body(
    model: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    *,
    continuous_usage: bool = True,
    ignore_eos: bool = True,
) -> dict[str, Any]:
    """A chat completion body: greedy, ``ignore_eos`` (a vLLM extension; sent only when set),
    streamed with the usage at the end, and with ``continuous_usage`` on
    every chunk (vLLM's ``continuous_usage_stats``, which the mesh's edge
    refuses as the OpenAI API does not know it)."""
    stream_options: dict[str, bool] = {"include_usage": True}
    if continuous_usage:
        stream_options["continuous_usage_stats"] = True
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": stream_options,
    }
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def chat_body(
    model: str, request: ChatRequest, *, continuous_usage: bool = True, ignore_eos: bool = True
) -> dict[str, Any]:
    """The JSON body of ``request`` (see :func:`streamed_body`)."""
    messages = [{"role": "system", "content": request.system}, {"role": "user", "content": request.user}]
    return streamed_body(
        model, messages, request.max_tokens, continuous_usage=continuous_usage, ignore_eos=ignore_eos
    )


class ChunkCounter:
    """Output tokens of one stream, chunk by chunk.

    A chunk that carries ``usage.completion_tokens`` adds what that total
    has over the tokens counted so far; one without adds a token per choice
    with content. So a server that puts usage on every chunk is counted
    exactly (also where the detokenizer holds text back), and one that sends
    usage only in a final chunk (a router that drops the per-chunk usage) is
    not counted twice."""

    def __init__(self) -> None:
        self.counted = 0

    def tokens_in(self, chunk: dict[str, Any]) -> int:
        """Tokens that ``chunk`` adds to the reply."""
        usage = chunk.get("usage")
        total = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if isinstance(total, int):
            added = max(0, total - self.counted)
        else:
            choices = chunk.get("choices") or []
            added = sum(1 for choice in choices if (choice.get("delta") or {}).get("content"))
        self.counted += added
        return added


class OpenAIChatClient:
    """Streams chat completions from ``base_url`` (``http://host:port``) for
    ``model``. One pooled connection per concurrent stream (HTTP/1.1); each
    request is bounded by ``request_timeout_s`` overall, with no read timeout
    that could cut a slow stream short. ``transport`` replaces the network
    (tests)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        max_connections: int,
        request_timeout_s: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._model = model
        self._timeout_s = request_timeout_s
        self._http = httpx.AsyncClient(
            base_url=base_url,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            timeout=httpx.Timeout(connect=10.0, read=None, write=30.0, pool=None),
            trust_env=False,
            transport=transport,
        )

    @property
    def model(self) -> str:
        return self._model

    async def generate(self, request: ChatRequest) -> RequestRecord:
        """See :class:`llmmesh.bench.loadgen.StreamingClient`."""
        return await self.stream(chat_body(self._model, request))

    async def stream(self, body: dict[str, Any]) -> RequestRecord:
        """Post ``body`` and follow the stream to its end; a stream that ends
        without ``data: [DONE]`` is a failure (recorded, not raised)."""
        record = RequestRecord(sent_at=time.perf_counter())
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._stream(body, record)
        except TimeoutError:
            record.fail(f"no complete reply within {self._timeout_s:.0f} s")
        except httpx.HTTPError as err:
            record.fail(f"{type(err).__name__}: {err}")
        except ValueError as err:  # a chunk that is not JSON
            record.fail(f"malformed chunk: {err}")
        if record.finished_at is None:
            record.fail("the stream ended without data: [DONE]")
        return record

    async def _stream(self, body: dict[str, Any], record: RequestRecord) -> None:
        counter = ChunkCounter()
        async with self._http.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")[:200]
                record.fail(f"HTTP {response.status_code}: {detail}")
                return
            async for line in response.aiter_lines():
                # Read before JSON parsing, so the peer is not charged for the
                # client's parsing (our pod is: gRPC parses before it yields).
                at = time.perf_counter()
                if not line.startswith(_DATA):
                    continue
                data = line[len(_DATA) :].strip()
                if data == _DONE:
                    record.finish(at)
                    return
                chunk = json.loads(data)
                if "error" in chunk:
                    record.fail(f"error event: {chunk['error']}")
                    continue
                record.add_tokens(at, counter.tokens_in(chunk))

    async def close(self) -> None:
        await self._http.aclose()
