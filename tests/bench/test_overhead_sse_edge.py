"""The overhead benchmark's SSE client against the mesh's real edge: the
body it sends is one the edge accepts, and it counts every token."""

from __future__ import annotations

import pytest

from llmmesh.bench.overhead_clients import SimChunkCounter
from llmmesh.bench.overhead_sse import SseChatClient
from llmmesh.bench.workload import ChatWorkload
from tests.stack import DEV_KEY, running_stack


@pytest.mark.asyncio
async def test_the_benchmark_client_streams_through_the_edge() -> None:
    async with running_stack(with_edge=True) as stack:
        assert stack.edge is not None
        client = SseChatClient(stack.edge.url, "auto", DEV_KEY, 30.0, SimChunkCounter)
        try:
            records = [await client.generate(request) for request in ChatWorkload().requests("edge", 2, 8)]
        finally:
            await client.close()
    for record in records:
        assert record.ok, record.error
        assert record.output_tokens == 8  # ignore_eos: exactly max_tokens
        assert record.ttft_s is not None
