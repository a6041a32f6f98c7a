"""The closed-loop driver: C workers, each sending its next request as soon
as its previous one ends, until the level's requests are all done."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from llmmesh.bench.stats import RequestRecord, summarize
from llmmesh.bench.workload import ChatRequest


class StreamingClient(Protocol):
    """A client of one system under test."""

    async def generate(self, request: ChatRequest) -> RequestRecord:
        """Send ``request``, stream its tokens, and return what was seen.
        Failures are recorded in the record (``fail``), not raised."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


@dataclass(frozen=True)
class LevelRun:
    """The records of one level, in request order, and its wall time."""

    records: list[RequestRecord]
    wall_s: float


ProgressCallback = Callable[[int, int], None]


async def run_closed_loop(
    client: StreamingClient,
    requests: Sequence[ChatRequest],
    concurrency: int,
    on_progress: ProgressCallback | None = None,
) -> LevelRun:
    """Run ``requests`` through ``client`` with ``concurrency`` workers.

    ``on_progress(done, total)`` is called after each request ends. The wall
    time runs from the first request sent to the last one ended. A client
    that raises despite its contract gets the exception recorded as the
    request's error; the level goes on."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be positive, got {concurrency}")
    records: list[RequestRecord | None] = [None] * len(requests)
    next_index = 0
    done = 0

    async def worker() -> None:
        nonlocal next_index, done
        while next_index < len(requests):
            index = next_index
            next_index += 1
            try:
                record = await client.generate(requests[index])
            except Exception as exc:
                record = RequestRecord(sent_at=time.perf_counter())
                record.fail(f"client raised {type(exc).__name__}: {exc}")
            records[index] = record
            done += 1
            if on_progress is not None:
                on_progress(done, len(requests))

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(min(concurrency, len(requests))):
            group.create_task(worker())
    wall_s = time.perf_counter() - started
    return LevelRun([record for record in records if record is not None], wall_s)


def quarter_reporter(report: Callable[[int, int], None]) -> ProgressCallback:
    """A progress callback that calls ``report(done, total)`` when ``done``
    first reaches each quarter of ``total`` (25%, 50%, 75%, 100%)."""
    reported = 0

    def on_progress(done: int, total: int) -> None:
        nonlocal reported
        quarter = done * 4 // total if total else 4
        if quarter > reported:
            reported = quarter
            report(done, total)

    return on_progress


async def measure_level(
    name: str,
    client: StreamingClient,
    requests: Sequence[ChatRequest],
    concurrency: int,
    progress: Callable[[str], None],
) -> LevelRun:
    """:func:`run_closed_loop`, told as it goes: one ``progress`` line for
    the start, each quarter done, the first failure and the level's figures."""
    progress(f"{name}: {len(requests)} requests, {concurrency} at a time")
    run = await run_closed_loop(
        client,
        requests,
        concurrency,
        quarter_reporter(lambda done, total: progress(f"{name}: {done}/{total} requests done")),
    )
    metrics = summarize(run.records, run.wall_s)
    errors = [record.error for record in run.records if record.error]
    if errors:
        progress(f"{name}: {len(errors)} failed, first: {errors[0]}")
    progress(
        f"{name}: {metrics.output_tok_s:.1f} output tok/s, ttft p50 {_ms(metrics.ttft_p50_s)} "
        f"p90 {_ms(metrics.ttft_p90_s)} p99 {_ms(metrics.ttft_p99_s)}, itl p50 {_ms(metrics.itl_p50_s)} "
        f"in {run.wall_s:.1f} s"
    )
    return run


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms"
