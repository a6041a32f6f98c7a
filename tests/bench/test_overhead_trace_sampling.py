"""How ``llmmesh bench overhead`` traces half of its traced mesh's turns:
the sampling dealt per round, paired by arrival delay, the split of a
round's records, and the ``traceparent`` its SSE client sends."""

from __future__ import annotations

import asyncio
import re

import pytest

from llmmesh.bench.loadgen import LevelRun
from llmmesh.bench.overhead_clients import ArrivalJitter, SimChunkCounter, TraceSampling, split_run
from llmmesh.bench.overhead_sse import SseChatClient
from llmmesh.bench.stats import RequestRecord
from llmmesh.bench.workload import ChatWorkload

TRACEPARENT = re.compile(rb"\r\ntraceparent: 00-([0-9a-f]{32})-([0-9a-f]{16})-(0[01])\r\n")


class _Inner:
    async def generate(self, request: object) -> RequestRecord:
        raise AssertionError("not sent")

    async def close(self) -> None:
        pass


def test_half_of_a_round_is_sampled_one_of_each_pair_of_neighbouring_delays() -> None:
    requests = ChatWorkload().requests("t", 16, 1)
    delays = ArrivalJitter(_Inner(), 0.016, "seed").deal("c16-r0", len(requests))
    sampling = TraceSampling("sampling")
    marks = sampling.deal("c16-r0", requests, delays)
    assert sum(marks) == 8
    by_delay = sorted(range(16), key=lambda index: delays[index])
    for start in range(0, 16, 2):
        first, second = by_delay[start : start + 2]
        assert marks[first] != marks[second]
    assert [sampling.flags(request) for request in requests] == ["01" if mark else "00" for mark in marks]
    # Seeded: the same round deals the same marks, another round others.
    assert TraceSampling("sampling").deal("c16-r0", requests, delays) == marks
    assert TraceSampling("sampling").deal("c16-r1", requests, delays) != marks
    # A request of no dealt round (a warm-up, a round's first) is sampled.
    assert sampling.flags(ChatWorkload().requests("warmup", 1, 1)[0]) == "01"
    # An odd round's last request has no pair: it is sampled.
    assert sum(TraceSampling("s").deal("odd", requests[:5], delays[:5])) == 3
    with pytest.raises(ValueError, match="3 delays for a round of 4"):
        sampling.deal("c16-r0", requests[:4], delays[:3])


def test_a_rounds_run_splits_into_its_sampled_and_unsampled_requests() -> None:
    records = [RequestRecord(sent_at=float(index)) for index in range(4)]
    sampled, unsampled = split_run(LevelRun(records, 8.0), [True, False, False, True])
    assert sampled.records == [records[0], records[3]] and unsampled.records == [records[1], records[2]]
    # Each half keeps the round's rate: half the requests in half the time.
    assert sampled.wall_s == unsampled.wall_s == 4.0
    with pytest.raises(ValueError, match="3 marks for a round of 4 requests"):
        split_run(LevelRun(records, 8.0), [True, False, True])


@pytest.mark.asyncio
async def test_the_sse_client_sends_each_request_a_traceparent_of_its_own_with_its_flags() -> None:
    heads: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            heads.append(head)
            body = b"data: [DONE]\n\n"
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
        writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    requests = ChatWorkload().requests("t", 3, 1)
    wanted = {id(requests[0]): "01", id(requests[1]): "00", id(requests[2]): "01"}
    client = SseChatClient(
        f"http://127.0.0.1:{port}", "m", "sk-test", 10.0, SimChunkCounter, lambda r: wanted[id(r)]
    )
    plain = SseChatClient(f"http://127.0.0.1:{port}", "m", "sk-test", 10.0, SimChunkCounter)
    bad = SseChatClient(f"http://127.0.0.1:{port}", "m", "sk-test", 10.0, SimChunkCounter, lambda r: "ff")
    try:
        for request in requests:
            assert (await client.generate(request)).ok
        assert (await plain.generate(requests[0])).ok
        with pytest.raises(ValueError, match="trace flags must be one of 01, 00"):
            await bad.generate(requests[0])
    finally:
        await client.close()
        await plain.close()
        listener.close()
        await listener.wait_closed()
    found = [TRACEPARENT.search(head) for head in heads]
    assert found[3] is None and b"traceparent" not in heads[3]
    parents = [match.groups() for match in found[:3] if match is not None]
    assert [flags for _, _, flags in parents] == [b"01", b"00", b"01"]
    # Each request a trace of its own.
    assert len({trace for trace, _, _ in parents}) == 3
