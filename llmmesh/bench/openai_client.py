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


def chat_body(model: str, request: ChatRequest) -> dict[str, Any]:
    """The JSON body of ``request``: greedy, ``ignore_eos`` (a vLLM
    extension), streamed with usage on every chunk."""
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": request.system},
            {"role": "user", "content": request.user},
        ],
        "max_tokens": request.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }


class ChunkCounter:
    """Turns the JSON chunks of one stream into token counts."""

    def __init__(self) -> None:
        self._completion_tokens = 0

    def tokens_in(self, chunk: dict[str, Any]) -> int:
        """Tokens that ``chunk`` adds to the reply."""
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            total: int = usage["completion_tokens"]
            added = max(0, total - self._completion_tokens)
            self._completion_tokens = max(total, self._completion_tokens)
            return added
        choices = chunk.get("choices") or []
        return sum(1 for choice in choices if (choice.get("delta") or {}).get("content"))


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

    async def generate(self, request: ChatRequest) -> RequestRecord:
        """See :class:`llmmesh.bench.loadgen.StreamingClient`. A stream that
        ends without ``data: [DONE]`` is a failure."""
        record = RequestRecord(sent_at=time.perf_counter())
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._stream(request, record)
        except TimeoutError:
            record.fail(f"no complete reply within {self._timeout_s:.0f} s")
        except httpx.HTTPError as err:
            record.fail(f"{type(err).__name__}: {err}")
        except ValueError as err:  # a chunk that is not JSON
            record.fail(f"malformed chunk: {err}")
        if record.finished_at is None:
            record.fail("the stream ended without data: [DONE]")
        return record

    async def _stream(self, request: ChatRequest, record: RequestRecord) -> None:
        counter = ChunkCounter()
        body = chat_body(self._model, request)
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
