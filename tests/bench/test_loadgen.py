"""The closed-loop driver, with a client that only sleeps."""

from __future__ import annotations

import asyncio
import time

import pytest

from llmmesh.bench.loadgen import quarter_reporter, run_closed_loop
from llmmesh.bench.stats import RequestRecord
from llmmesh.bench.workload import ChatRequest, ChatWorkload


class SleepyClient:
    """Answers every request with ``tokens`` one-token chunks, counting how
    many requests are in flight at once."""

    def __init__(self, tokens: int = 3, fail: str | None = None, raise_on: str | None = None) -> None:
        self.tokens = tokens
        self.fail = fail
        self.raise_on = raise_on
        self.in_flight = 0
        self.most_in_flight = 0
        self.seen: list[str] = []

    async def generate(self, request: ChatRequest) -> RequestRecord:
        self.seen.append(request.request_id)
        if request.request_id == self.raise_on:
            raise RuntimeError("broken client")
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        record = RequestRecord(sent_at=time.perf_counter())
        try:
            for _ in range(self.tokens):
                await asyncio.sleep(0.001)
                record.add_tokens(time.perf_counter(), 1)
            if request.request_id == self.fail:
                record.fail("injected")
            else:
                record.finish(time.perf_counter())
        finally:
            self.in_flight -= 1
        return record

    async def close(self) -> None:
        return None


@pytest.mark.asyncio
async def test_every_request_runs_once_at_the_given_concurrency() -> None:
    requests = ChatWorkload().requests("c4", 16, 8)
    client = SleepyClient()
    progress: list[tuple[int, int]] = []
    run = await run_closed_loop(client, requests, 4, lambda done, total: progress.append((done, total)))
    assert sorted(client.seen) == sorted(request.request_id for request in requests)
    assert client.most_in_flight == 4
    assert len(run.records) == 16
    assert all(record.ok and record.output_tokens == 3 for record in run.records)
    assert progress == [(done, 16) for done in range(1, 17)]
    assert run.wall_s > 0


@pytest.mark.asyncio
async def test_failures_are_recorded_and_the_level_goes_on() -> None:
    requests = ChatWorkload().requests("c2", 6, 8)
    client = SleepyClient(fail="c2-1", raise_on="c2-4")
    run = await run_closed_loop(client, requests, 2)
    assert [record.error for record in run.records] == [
        None,
        "injected",
        None,
        None,
        "client raised RuntimeError: broken client",
        None,
    ]


@pytest.mark.asyncio
async def test_concurrency_above_the_request_count_is_fine() -> None:
    run = await run_closed_loop(SleepyClient(), ChatWorkload().requests("c8", 2, 8), 8)
    assert len(run.records) == 2


def test_quarter_reporter_reports_each_quarter_once() -> None:
    seen: list[int] = []
    on_progress = quarter_reporter(lambda done, total: seen.append(done))
    for done in range(1, 11):
        on_progress(done, 10)
    assert seen == [3, 5, 8, 10]
