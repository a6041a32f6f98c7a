"""``llmmesh bench overhead``: the plan and its flags, the edge's token
counter, the arrival delay, the report, and one small run of the real mesh
end to end. No assertion on timing: timing claims live in the benchmark's
output."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import cast

import pytest

from llmmesh.bench import overhead
from llmmesh.bench.overhead_clients import ArrivalJitter, SimChunkCounter
from llmmesh.bench.overhead_hops import HopTable
from llmmesh.bench.overhead_plan import OverheadBenchPlan, SimTiming, overhead_plan_from_args
from llmmesh.bench.overhead_report import (
    TARGETS_MEASURED_ON,
    DefaultPathTargets,
    OverheadReport,
    OverheadRun,
    PathMetrics,
    Targets,
    filter_added,
    key,
    systems_of,
    targets_measured_on,
)
from llmmesh.bench.overhead_sse import SseChatClient
from llmmesh.bench.stats import RequestRecord
from llmmesh.bench.workload import ChatRequest, ChatWorkload
from llmmesh.cli.main import build_parser
from llmmesh.engine.sim.tokenizer import SimTokenizer

METRICS = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "output_tok_s", "errors")

# ---------------------------------------------------------------- plan


def _plan(*flags: str) -> OverheadBenchPlan:
    return overhead_plan_from_args(build_parser().parse_args(["bench", "overhead", *flags]))


def test_default_plan_measures_the_transport_then_the_product_path() -> None:
    plan = _plan()
    assert plan == OverheadBenchPlan()
    assert plan.levels == (1, 16, 64)
    # Safety filters off first (the transport), then on (the product path).
    assert plan.safety_runs == (False, True)
    # Enough requests at c16 that p99 is not just the second-worst sample.
    assert [plan.requests_at(level) for level in plan.levels] == [32, 384, 1536]
    assert plan.round_sizes(16) == [192, 192]
    assert plan.max_num_seqs == 64 and plan.warmup == 128
    assert plan.jitter_s == plan.timing.inter_token_s == 0.015
    # A plaintext mesh, its twin and an mTLS one side by side in the transport run only.
    assert plan.tls == "both"
    assert (plan.meshes_of(False), plan.meshes_of(True)) == ((False, False, True), (False,))
    assert (plan.tls_of(False), plan.tls_of(True)) == ("both", "off")


def test_flags_win_over_quick() -> None:
    plan = _plan(
        "--quick",
        "--levels",
        "1,3",
        "--requests-per-level",
        "5",
        "--max-tokens",
        "7",
        "--warmup",
        "0",
        "--safety",
        "off",
        "--step-ms",
        "10",
        "--prefill-ms",
        "0",
        "--arrival-jitter-ms",
        "0",
    )
    assert (plan.levels, plan.requests_at(3), plan.max_tokens, plan.warmup) == ((1, 3), 5, 7, 0)
    assert plan.safety_runs == (False,)
    assert plan.timing == SimTiming(inter_token_s=0.01, prefill_s=0.0)
    assert plan.jitter_s == 0.0
    assert plan.round_sizes(3) == [3, 2]
    quick = _plan("--quick")
    assert quick.levels == (1, 2) and quick.requests_at(2) == 4 and quick.max_tokens == 16
    assert quick.safety_runs == (False, True)
    assert _plan("--requests", "40").requests_at(64) == 40


@pytest.mark.parametrize(("flag", "runs"), [("both", (False, True)), ("off", (False,)), ("on", (True,))])
def test_safety_flag_picks_the_runs(flag: str, runs: tuple[bool, ...]) -> None:
    assert _plan("--safety", flag).safety_runs == runs
    assert _plan("--quick", "--safety", flag).safety_runs == runs


@pytest.mark.parametrize(
    ("flags", "meshes"),
    [
        ((), {False: (False, False, True), True: (False,)}),
        (("--safety", "on"), {True: (False, False, True)}),
        (("--tls", "off"), {False: (False,), True: (False,)}),
        (("--tls", "on"), {False: (True,), True: (True,)}),
        (("--tls", "on", "--safety", "on"), {True: (True,)}),
    ],
)
def test_tls_flag_picks_each_runs_meshes(
    flags: tuple[str, ...], meshes: dict[bool, tuple[bool, ...]]
) -> None:
    plan = _plan(*flags)
    assert {safety: plan.meshes_of(safety) for safety in plan.safety_runs} == meshes


def test_tracing_flag_adds_a_traced_mesh_and_its_twin_to_the_first_run() -> None:
    assert _plan().tracing == "off" and not _plan().traced_in(False)
    plan = _plan("--tracing", "both")
    assert (plan.traced_in(False), plan.traced_in(True)) == (True, False)
    assert systems_of(plan.tls_of(False), plan.traced_in(False)) == (
        "direct",
        "mesh",
        "mesh_twin",
        "mesh_mtls",
        "mesh_traced",
        "mesh_unsampled",
    )
    assert systems_of("off", traced=True) == ("direct", "mesh", "mesh_twin", "mesh_traced", "mesh_unsampled")
    assert systems_of(plan.tls_of(True), plan.traced_in(True)) == ("direct", "mesh")
    assert _plan("--tracing", "both", "--safety", "on").traced_in(True)
    with pytest.raises(ValueError, match="tracing both compares plaintext meshes"):
        _plan("--tracing", "both", "--tls", "on")
    with pytest.raises(ValueError, match="tracing must be one of"):
        OverheadBenchPlan(tracing="on")


def test_timing_is_pinned_by_flags_with_no_batch_slowdown() -> None:
    flags = SimTiming(0.012, 0.03).engine_flags()
    pinned = dict(zip(flags[::2], flags[1::2], strict=True))
    assert pinned == {
        "--sim-inter-token-s": "0.012",
        "--sim-batch-load-factor": "0",
        "--sim-prefill-overhead-s": "0.03",
        "--sim-prefill-per-token-s": "0",
    }


def test_impossible_plans_are_refused() -> None:
    with pytest.raises(ValueError, match="rounds"):
        OverheadBenchPlan(requests_per_level=1, rounds=2)
    with pytest.raises(ValueError, match="levels"):
        OverheadBenchPlan(levels=(0,))
    with pytest.raises(ValueError, match="decode step"):
        SimTiming(inter_token_s=0.0)
    with pytest.raises(SystemExit):
        _plan("--safety", "maybe")
    for runs in [(), (True, False), (False, False)]:
        with pytest.raises(ValueError, match="safety"):
            OverheadBenchPlan(safety_runs=runs)
    with pytest.raises(ValueError, match="tls"):
        OverheadBenchPlan(tls="sometimes")
    with pytest.raises(SystemExit):
        _plan("--tls", "maybe")
    with pytest.raises(ValueError, match="reply lengths"):
        OverheadBenchPlan(reply_lengths="long")
    with pytest.raises(SystemExit):
        _plan("--reply-lengths", "long")


def test_replies_are_max_tokens_long_unless_natural_lengths_are_asked_for() -> None:
    assert _plan().reply_lengths == "fixed"
    assert _plan("--reply-lengths", "natural").reply_lengths == "natural"


# ---------------------------------------------------------------- clients


def _content(text: str) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": text}}], "usage": None}


def test_edge_chunks_are_counted_in_the_simulators_tokens() -> None:
    counter = SimChunkCounter()
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    assert counter.tokens_in(role) == 0
    assert counter.tokens_in(_content(" the")) == 1
    # A chunk the output filter released whole: several tokens at once.
    text = " of, and. The water"
    assert counter.tokens_in(_content(text)) == len(SimTokenizer().encode(text)) == 6
    # The usage chunk settles what the text did not count, never less.
    assert counter.tokens_in({"choices": [], "usage": {"completion_tokens": 9}}) == 2
    assert counter.counted == 9
    assert SimChunkCounter().tokens_in({"choices": [], "usage": {"completion_tokens": 0}}) == 0


class _Logged:
    """A client that logs each request it is asked to send."""

    def __init__(self, log: list[tuple[str, object]]) -> None:
        self.log = log
        self.closed = False

    async def generate(self, request: ChatRequest) -> RequestRecord:
        self.log.append(("send", request.request_id))
        record = RequestRecord(sent_at=time.perf_counter())
        record.add_tokens(time.perf_counter(), 1)
        record.finish(time.perf_counter())
        return record

    async def close(self) -> None:
        self.closed = True


@pytest.mark.asyncio
async def test_each_request_waits_its_seeded_delay_before_it_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[tuple[str, object]] = []

    async def sleep(delay: float) -> None:
        log.append(("sleep", delay))

    monkeypatch.setattr("llmmesh.bench.overhead_clients.asyncio.sleep", sleep)
    requests = ChatWorkload().requests("t", 3, 1)
    inner = _Logged(log)
    jittered = ArrivalJitter(inner, 0.015, "seed")
    records = [await jittered.generate(request) for request in requests]
    assert all(record.ok for record in records)
    assert [kind for kind, _ in log] == ["sleep", "send"] * 3
    delays = [value for kind, value in log if kind == "sleep"]
    assert all(isinstance(delay, float) and 0.0 <= delay < 0.015 for delay in delays)
    # Another system's client with the same seed draws the same delays.
    log.clear()
    await ArrivalJitter(inner, 0.015, "seed").generate(requests[0])
    assert log[0] == ("sleep", delays[0])
    await jittered.close()
    assert inner.closed


@pytest.mark.asyncio
async def test_a_dealt_round_spreads_its_delays_one_to_each_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[tuple[str, object]] = []

    async def sleep(delay: float) -> None:
        log.append(("sleep", delay))

    monkeypatch.setattr("llmmesh.bench.overhead_clients.asyncio.sleep", sleep)
    requests = ChatWorkload().requests("t", 8, 1)
    inner = _Logged(log)

    async def dealt(seed: str, round_name: str) -> list[float]:
        log.clear()
        jittered = ArrivalJitter(inner, 0.016, seed)
        jittered.deal(round_name, len(requests))
        for request in requests:
            await jittered.generate(request)
        return [float(value) for kind, value in log if kind == "sleep"]  # type: ignore[arg-type]

    delays = await dealt("seed", "c16-r0")
    # One delay in each 2 ms slice of the 16 ms range, in no fixed order.
    assert sorted(int(delay // 0.002) for delay in delays) == list(range(8))
    assert delays != sorted(delays)
    # Every system dealt the same round draws the same delays; another round others.
    assert await dealt("seed", "c16-r0") == delays
    assert await dealt("seed", "c16-r1") != delays
    # Past the dealt ones, delays are drawn as before.
    log.clear()
    jittered = ArrivalJitter(inner, 0.016, "seed")
    jittered.deal("c16-r0", 1)
    await jittered.generate(requests[0])
    await jittered.generate(requests[1])
    assert all(0.0 <= float(value) < 0.016 for kind, value in log if kind == "sleep")  # type: ignore[arg-type]


class _SseServer:
    """A tiny HTTP/1.1 server answering every POST with ``reply(n)``, the
    n-th reply's raw bytes (head and body); closes the connection after a
    reply when ``close_after`` says so."""

    def __init__(self, reply: Callable[[int], bytes], close_after: bool = False) -> None:
        self.reply = reply
        self.close_after = close_after
        self.connections = 0
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                self.requests.append(head + await reader.readexactly(length))
                writer.write(self.reply(len(self.requests)))
                await writer.drain()
                if self.close_after:
                    break
        except asyncio.IncompleteReadError:
            pass
        writer.close()


def _chunked(body: bytes, pieces: int) -> bytes:
    """``body`` as a chunked HTTP 200 response cut into ``pieces`` chunks."""
    step = -(-len(body) // pieces)
    chunks = [body[i : i + step] for i in range(0, len(body), step)]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks) + b"0\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + framed


def _sse(*payloads: object) -> bytes:
    return b"".join(
        b"id: %d\ndata: %s\n\n" % (index, json.dumps(p).encode() if not isinstance(p, bytes) else p)
        for index, p in enumerate(payloads)
    )


STREAM = _sse(
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
    _content(" the"),
    _content(" of, and"),
    {"choices": [], "usage": {"completion_tokens": 5}},
    b"[DONE]",
)


@contextlib.asynccontextmanager
async def _serving(server: _SseServer, ignore_eos: bool = True) -> AsyncIterator[SseChatClient]:
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    client = SseChatClient(
        f"http://127.0.0.1:{port}", "m", "sk-test", 10.0, SimChunkCounter, ignore_eos=ignore_eos
    )
    try:
        yield client
    finally:
        await client.close()
        listener.close()
        await listener.wait_closed()


@pytest.mark.asyncio
async def test_sse_client_reads_events_across_chunks_and_keeps_the_connection() -> None:
    server = _SseServer(lambda n: _chunked(STREAM, pieces=7))
    request = ChatWorkload().requests("t", 1, 5)[0]
    async with _serving(server) as client:
        first = await client.generate(request)
        second = await client.generate(request)
    for record in (first, second):
        assert record.ok, record.error
        assert [count for _, count in record.chunks] == [1, 3, 1]
    assert server.connections == 1
    sent = server.requests[0]
    assert sent.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"Authorization: Bearer sk-test" in sent
    body = json.loads(sent.split(b"\r\n\r\n", 1)[1])
    assert body["max_tokens"] == 5 and body["stream"] is True and body["ignore_eos"] is True


@pytest.mark.asyncio
async def test_sse_client_for_natural_lengths_leaves_ignore_eos_out() -> None:
    server = _SseServer(lambda n: _chunked(STREAM, pieces=1))
    async with _serving(server, ignore_eos=False) as client:
        record = await client.generate(ChatWorkload().requests("t", 1, 5)[0])
    assert record.ok, record.error
    assert "ignore_eos" not in json.loads(server.requests[0].split(b"\r\n\r\n", 1)[1])


@pytest.mark.asyncio
async def test_sse_client_reconnects_when_the_server_closed_a_kept_connection() -> None:
    server = _SseServer(lambda n: _chunked(STREAM, pieces=2), close_after=True)
    request = ChatWorkload().requests("t", 1, 5)[0]
    async with _serving(server) as client:
        records = [await client.generate(request) for _ in range(3)]
    assert all(record.ok for record in records)
    assert server.connections == 3


@pytest.mark.asyncio
async def test_sse_client_records_http_errors_and_error_events() -> None:
    error = b'{"error": {"message": "bad key", "code": "invalid_api_key"}}'
    refused = b"HTTP/1.1 401 Unauthorized\r\ncontent-length: %d\r\n\r\n%s" % (len(error), error)
    broken = _chunked(_sse(_content(" the"), {"error": {"message": "region lost"}}), pieces=1)
    replies = {1: refused, 2: broken}
    server = _SseServer(lambda n: replies[n])
    request = ChatWorkload().requests("t", 1, 5)[0]
    async with _serving(server) as client:
        unauthorized = await client.generate(request)
        cut = await client.generate(request)
    assert (
        unauthorized.error is not None
        and "HTTP 401" in unauthorized.error
        and "bad key" in unauthorized.error
    )
    assert cut.error is not None and "region lost" in cut.error
    assert cut.output_tokens == 1


# ---------------------------------------------------------------- report


def _records(ttft_s: float, gap_s: float, tokens: int, count: int) -> list[RequestRecord]:
    records = []
    for index in range(count):
        record = RequestRecord(sent_at=float(index))
        for token in range(tokens):
            record.add_tokens(index + ttft_s + token * gap_s, 1)
        record.finish(index + ttft_s + tokens * gap_s)
        records.append(record)
    return records


def _mesh_records(ttft_s: float, tail_s: float | None) -> list[RequestRecord]:
    """Ten requests, nine with their first token at ``ttft_s``, the last at ``tail_s``."""
    return _records(ttft_s, 0.016, 4, 9) + _records(tail_s or ttft_s, 0.016, 4, 1)


def _run(
    levels: tuple[int, ...],
    safety: bool = False,
    mesh_ttft_s: float = 0.042,
    mesh_tail_s: float | None = None,
) -> OverheadRun:
    """A run where direct's first token comes at 40 ms and mesh's at
    ``mesh_ttft_s`` (the last of its ten requests at ``mesh_tail_s``)."""
    results = {}
    for level in levels:
        results[key("direct", level)] = PathMetrics.of(_records(0.040, 0.015, 4, 10), 2.0)
        results[key("mesh", level)] = PathMetrics.of(_mesh_records(mesh_ttft_s, mesh_tail_s), 2.5)
    setup = {"safety_backends": "rules" if safety else "none", "ignore_eos": True}
    return OverheadRun(safety, results, {"c1": 0}, setup)


def _mtls_run(
    levels: tuple[int, ...], mtls_ttft_s: float, mtls_tail_s: float | None = None, twin_ttft_s: float = 0.042
) -> OverheadRun:
    """:func:`_run` with the mesh's twin beside it, its first tokens at
    ``twin_ttft_s``, and the same mesh on mTLS, its first tokens at
    ``mtls_ttft_s`` (the last of ten at ``mtls_tail_s``)."""
    plain = _run(levels)
    results = dict(plain.results)
    for level in levels:
        results[key("mesh_twin", level)] = PathMetrics.of(_mesh_records(twin_ttft_s, None), 2.5)
        results[key("mesh_mtls", level)] = PathMetrics.of(_mesh_records(mtls_ttft_s, mtls_tail_s), 2.5)
    return OverheadRun(False, results, plain.length_mismatches, plain.setup, tls="both")


def _report(levels: tuple[int, ...], *runs: OverheadRun) -> OverheadReport:
    return OverheadReport("llmmesh-tiny", levels, runs or (_run(levels),), {"engine": {}}, "test")


def test_report_derives_what_the_mesh_adds_from_the_figures() -> None:
    report = _report((1, 16))
    body = json.loads(report.to_json())
    assert body["scenario"] == "overhead"
    assert set(body["results"]) == {"direct/c1", "mesh/c1", "direct/c16", "mesh/c16"}
    mesh, direct = body["results"]["mesh/c16"], body["results"]["direct/c16"]
    assert set(METRICS) <= set(mesh)
    ratios = body["ratios"]["c16"]
    assert ratios["added_ttft_p50_ms"] == pytest.approx((mesh["ttft_p50_s"] - direct["ttft_p50_s"]) * 1000)
    assert ratios["added_ttft_p99_ms"] == pytest.approx(2.0)
    assert ratios["output_tok_s_ratio"] == pytest.approx(mesh["output_tok_s"] / direct["output_tok_s"])
    assert body["targets"]["concurrency"] == 16
    # +2 ms at p50 and p99, 80% of direct's throughput.
    # No mTLS mesh in this run: no verdict on it, and ``all`` leaves it out.
    assert body["targets_met"] == {
        "added_ttft_p50": True,
        "added_ttft_p99": True,
        "output_tok_s": True,
        "mtls_ttft_p50": None,
        "traced_ttft_p50": None,
        "all": True,
    }
    assert not any(name.startswith("mtls") for name in ratios)
    assert body["targets_measured_on"] == targets_measured_on(False, "off")
    assert body["targets_measured_on"].startswith(TARGETS_MEASURED_ON[False])
    assert "with_output_filter" not in body
    assert body["setup"]["runs"] == {
        "transport": {
            "safety": "off",
            "tls": "off",
            "tracing": "off",
            "safety_backends": "none",
            "ignore_eos": True,
        }
    }
    strict = Targets(added_ttft_p50_ms_max=1.0)
    assert strict.met(report.deltas()["c16"])["all"] is False
    assert "what the mesh adds" in report.to_table()
    assert ratios["added_ttft_after_idle_ms"] is None  # no round starts in this run


def test_what_mtls_adds_is_the_mtls_mesh_less_the_plaintext_one() -> None:
    # Plaintext mesh: 42 ms at every percentile; mTLS: 42.6 ms for nine
    # requests in ten, and its slowest at 45 ms.
    levels = (1, 16)
    report = _report(levels, _mtls_run(levels, mtls_ttft_s=0.0426, mtls_tail_s=0.045))
    body = json.loads(report.to_json())
    assert set(body["results"]) == {
        f"{system}/c{level}" for system in ("direct", "mesh", "mesh_twin", "mesh_mtls") for level in levels
    }
    results, ratios = body["results"], body["ratios"]["c16"]
    for percentile in ("p50", "p90", "p99"):
        mtls, twin = (
            results["mesh_mtls/c16"][f"ttft_{percentile}_s"],
            results["mesh_twin/c16"][f"ttft_{percentile}_s"],
        )
        assert ratios[f"mtls_added_ttft_{percentile}_ms"] == pytest.approx((mtls - twin) * 1000, abs=1e-4)
    assert ratios["twin_added_ttft_p50_ms"] == pytest.approx(0.0)
    assert ratios["mtls_added_ttft_p50_ms"] == pytest.approx(0.6)
    assert ratios["mtls_added_ttft_p99_ms"] > 0.6
    # What the mesh adds over direct is still the plaintext mesh's.
    assert ratios["added_ttft_p50_ms"] == pytest.approx(2.0)
    assert ratios["mtls_added_ttft_after_idle_ms"] is None  # no round starts in this run
    assert body["targets"]["mtls_added_ttft_p50_ms_max"] == 1.0
    assert body["targets_met"]["mtls_ttft_p50"] is True and body["targets_met"]["all"] is True
    assert body["targets_measured_on"] == targets_measured_on(False, "both")
    assert "mesh_mtls" in body["targets_measured_on"]
    assert body["setup"]["runs"]["transport"]["tls"] == "both"
    table = report.to_table()
    assert "mesh_mtls/c16" in table
    header = next(line for line in table.splitlines() if line.startswith("level") and "mtls p50" in line)
    row = table.splitlines()[table.splitlines().index(header) + 2]
    assert row.split()[0] == "c16" and row.split()[-3] == "+0.6ms" and row.split()[-4] == "+0.0ms"
    # Every plaintext sample at 42 ms, nine in ten mTLS ones at 42.6 ms:
    # each resampled median differs by 0.6 ms.
    assert ratios["mtls_added_ttft_p50_ci95_low_ms"] == pytest.approx(0.6)
    assert ratios["mtls_added_ttft_p50_ci95_high_ms"] == pytest.approx(0.6)
    assert ratios["mtls_added_ttft_mean_ms"] == pytest.approx(0.6 + 2.4 / 10)
    assert row.split()[-1] == "[+0.6,+0.6]ms"
    assert "mtls_ttft_p50 met" in table

    # What mTLS adds is measured against the twin, not the mesh whose pod direct shares.
    shifted = json.loads(_report(levels, _mtls_run(levels, mtls_ttft_s=0.0435, twin_ttft_s=0.043)).to_json())
    assert shifted["ratios"]["c16"]["mtls_added_ttft_p50_ms"] == pytest.approx(0.5)
    assert shifted["ratios"]["c16"]["twin_added_ttft_p50_ms"] == pytest.approx(1.0)
    assert shifted["targets_met"]["mtls_ttft_p50"] is True

    # 1.5 ms more at the median misses the target, and with it ``all``.
    slow = json.loads(_report(levels, _mtls_run(levels, mtls_ttft_s=0.0435)).to_json())
    assert slow["ratios"]["c16"]["mtls_added_ttft_p50_ms"] == pytest.approx(1.5)
    assert slow["targets_met"]["mtls_ttft_p50"] is False and slow["targets_met"]["all"] is False
    assert slow["targets_met"]["added_ttft_p50"] is True


def _traced_run(
    levels: tuple[int, ...],
    traced_ttft_s: float,
    twin_ttft_s: float = 0.042,
    unsampled_ttft_s: float = 0.0421,
) -> OverheadRun:
    """:func:`_run` with the mesh's twin beside it, its first tokens at
    ``twin_ttft_s``, and the same mesh traced: its sampled turns' first
    tokens at ``traced_ttft_s``, its unsampled ones' at ``unsampled_ttft_s``."""
    plain = _run(levels)
    results = dict(plain.results)
    for level in levels:
        results[key("mesh_twin", level)] = PathMetrics.of(_mesh_records(twin_ttft_s, None), 2.5)
        results[key("mesh_traced", level)] = PathMetrics.of(_mesh_records(traced_ttft_s, None), 2.5)
        results[key("mesh_unsampled", level)] = PathMetrics.of(_mesh_records(unsampled_ttft_s, None), 2.5)
    setup = {**plain.setup, "traced_spans_exported": 120}
    return OverheadRun(False, results, plain.length_mismatches, setup, tls="off", traced=True)


def test_what_tracing_adds_is_the_sampled_turns_less_the_unsampled_ones_of_the_same_mesh() -> None:
    levels = (1, 16)
    report = _report(levels, _traced_run(levels, traced_ttft_s=0.0424, twin_ttft_s=0.0410))
    body = json.loads(report.to_json())
    systems = ("direct", "mesh", "mesh_twin", "mesh_traced", "mesh_unsampled")
    assert set(body["results"]) == {f"{system}/c{level}" for system in systems for level in levels}
    ratios = body["ratios"]["c16"]
    # Sampled 42.4 ms against unsampled 42.1 ms in the same mesh: the target's figure.
    assert ratios["traced_added_ttft_p50_ms"] == pytest.approx(0.3)
    assert ratios["traced_added_ttft_p50_ci95_low_ms"] == pytest.approx(0.3)
    assert ratios["traced_added_ttft_p50_ci95_high_ms"] == pytest.approx(0.3)
    # Against the twin, a mesh of its own, it is 1.4 ms; the twin is 1 ms off the mesh.
    assert ratios["traced_vs_twin_added_ttft_p50_ms"] == pytest.approx(1.4)
    assert ratios["twin_added_ttft_p50_ms"] == pytest.approx(-1.0)
    assert "mtls_added_ttft_p50_ms" not in ratios
    assert ratios["traced_added_ttft_after_idle_ms"] is None  # no round starts in this run
    assert body["targets"]["traced_added_ttft_p50_ms_max"] == 1.0
    assert body["targets_met"]["traced_ttft_p50"] is True and body["targets_met"]["mtls_ttft_p50"] is None
    assert body["setup"]["runs"]["transport"]["tracing"] == "both"
    assert body["setup"]["runs"]["transport"]["traced_spans_exported"] == 120
    assert "mesh_traced" in body["targets_measured_on"] and "mesh_unsampled" in body["targets_measured_on"]
    table = report.to_table()
    lines = table.splitlines()
    title = next(line for line in lines if line.startswith("what tracing adds"))
    row = lines[lines.index(title) + 3].split()
    assert row[0] == "c16" and row[1] == "+0.3ms" and row[3] == "[+0.3,+0.3]ms" and row[5] == "+1.4ms"
    assert "traced_ttft_p50 met" in table

    slow = json.loads(_report(levels, _traced_run(levels, traced_ttft_s=0.0436)).to_json())
    assert slow["ratios"]["c16"]["traced_added_ttft_p50_ms"] == pytest.approx(1.5)
    assert slow["targets_met"]["traced_ttft_p50"] is False and slow["targets_met"]["all"] is False


def test_mtls_after_idle_and_a_missing_mtls_result() -> None:
    levels = (16,)
    run = _mtls_run(levels, mtls_ttft_s=0.043)
    starts = {
        key("direct", 16): _records(0.040, 0.015, 4, 2),
        key("mesh", 16): _records(0.046, 0.016, 4, 2),
        key("mesh_twin", 16): _records(0.047, 0.016, 4, 2),
        key("mesh_mtls", 16): _records(0.050, 0.016, 4, 2),
    }
    idle = OverheadRun(False, run.results, {}, {}, starts, tls="both")
    ratios = json.loads(_report(levels, idle).to_json())["ratios"]["c16"]
    assert ratios["added_ttft_after_idle_ms"] == pytest.approx(6.0)
    assert ratios["mtls_added_ttft_after_idle_ms"] == pytest.approx(3.0)
    starts[key("mesh_mtls", 16)][0].fail("handshake failed")
    assert idle.errors() == 1
    # A run that says it measured mTLS needs its results.
    without = {name: value for name, value in run.results.items() if not name.startswith("mesh_mtls")}
    with pytest.raises(ValueError, match="mesh_mtls/c16"):
        _report(levels, OverheadRun(False, without, tls="both"))
    # A measured mTLS mesh whose requests all failed meets nothing.
    failed = _records(0.043, 0.016, 4, 2)
    for record in failed:
        record.fail("handshake failed")
    broken = OverheadRun(
        False, {**run.results, key("mesh_mtls", 16): PathMetrics.of(failed, 1.0)}, tls="both"
    )
    verdicts = _report(levels, broken).targets_met()
    assert verdicts["mtls_ttft_p50"] is False and verdicts["all"] is False


def test_round_starts_after_idle_are_reported_apart_and_their_failures_counted() -> None:
    levels = (16,)
    run = _run(levels)
    direct_starts = _records(0.040, 0.015, 4, 2)  # 40 ms each
    mesh_starts = _records(0.046, 0.016, 4, 1) + _records(0.050, 0.016, 4, 1) + _records(0.090, 0.016, 4, 1)
    idle = OverheadRun(
        False, run.results, {}, {}, {key("direct", 16): direct_starts, key("mesh", 16): mesh_starts}
    )
    body = json.loads(_report(levels, idle).to_json())
    # The median of the mesh's (50 ms) less direct's (40 ms); the round figures are untouched.
    assert body["ratios"]["c16"]["added_ttft_after_idle_ms"] == pytest.approx(10.0)
    assert body["ratios"]["c16"]["added_ttft_p99_ms"] == pytest.approx(2.0)
    assert body["results"]["mesh/c16"]["requests"] == 10
    assert "+10.0" in _report(levels, idle).to_table()
    mesh_starts[0].fail("region lost")
    assert idle.errors() == 1


def test_report_without_the_targets_level_has_no_verdict() -> None:
    body = json.loads(_report((1, 2)).to_json())
    assert set(body["targets_met"].values()) == {None}
    assert "mtls_ttft_p50" in body["targets_met"]
    with pytest.raises(ValueError, match="no result"):
        OverheadReport("m", (4,), (OverheadRun(False, {}),), {}, "test")


def test_report_holds_one_run_or_one_without_and_one_with_the_filter() -> None:
    off, on = _run((1,)), _run((1,), safety=True)
    with pytest.raises(ValueError, match="one run"):
        _report((1,), off, off)
    with pytest.raises(ValueError, match="one run"):
        OverheadReport("m", (1,), (), {}, "test")
    with pytest.raises(ValueError, match="one run"):
        _report((1,), off, on, off)
    # The order the runs are given in does not change which one is judged.
    assert _report((1,), on, off).targets_run is off
    assert _report((1,), off, on).filter_run is on


def test_filter_added_is_what_the_mesh_adds_with_the_filter_less_without() -> None:
    off = {"c1": {"added_ttft_p50_ms": 2.0, "added_ttft_p99_ms": 4.0}}
    on = {"c1": {"added_ttft_p50_ms": 17.5, "added_ttft_p99_ms": 30.0}}
    assert filter_added(on, off) == {
        "filter_added_ttft_p50_ms": {"c1": 15.5},
        "filter_added_ttft_p99_ms": {"c1": 26.0},
    }
    missing = {"c1": {"added_ttft_p50_ms": None, "added_ttft_p99_ms": 4.0}}
    assert filter_added(on, missing)["filter_added_ttft_p50_ms"] == {"c1": None}


def test_both_runs_report_the_transport_at_the_top_and_the_filter_apart() -> None:
    levels = (1, 16)
    # Without the filter the mesh adds 2 ms; with it 17 ms at the median
    # and, with one slow request in ten, more at the tail.
    off = _run(levels)
    on = _run(levels, safety=True, mesh_ttft_s=0.057, mesh_tail_s=0.080)
    report = _report(levels, off, on)
    body = json.loads(report.to_json())
    assert body["targets_measured_on"] == targets_measured_on(False, "off")
    assert body["ratios"]["c16"]["added_ttft_p50_ms"] == pytest.approx(2.0)
    assert body["targets_met"]["all"] is True
    assert body["setup"]["engine"] == {}
    assert body["setup"]["runs"] == {
        "transport": {
            "safety": "off",
            "tls": "off",
            "tracing": "off",
            "safety_backends": "none",
            "ignore_eos": True,
        },
        "with_output_filter": {
            "safety": "on",
            "tls": "off",
            "tracing": "off",
            "safety_backends": "rules",
            "ignore_eos": True,
        },
    }
    filtered = body["with_output_filter"]
    assert set(filtered) == {
        "results",
        "ratios",
        "hops",
        "filter_added_ttft_p50_ms",
        "filter_added_ttft_p99_ms",
    }
    assert set(filtered["results"]) == set(body["results"])
    assert filtered["ratios"]["c16"]["added_ttft_p50_ms"] == pytest.approx(17.0)
    for level in ("c1", "c16"):
        assert filtered["filter_added_ttft_p50_ms"][level] == pytest.approx(15.0)
        results_on, results_off = filtered["results"], body["results"]
        added_on = results_on[f"mesh/{level}"]["ttft_p99_s"] - results_on[f"direct/{level}"]["ttft_p99_s"]
        added_off = results_off[f"mesh/{level}"]["ttft_p99_s"] - results_off[f"direct/{level}"]["ttft_p99_s"]
        p99 = filtered["filter_added_ttft_p99_ms"][level]
        assert p99 == pytest.approx((added_on - added_off) * 1000, abs=1e-4)
        assert p99 > 15.0
        assert p99 == round(p99, 4)
    table = report.to_table()
    assert "transport: the region's safety filters off" in table
    assert "with the output filter: the region's safety filters on" in table
    assert table.count("what the mesh adds\n") == 2
    filter_lines = table.split("what the output filter adds to time to first token")[1].splitlines()
    assert filter_lines[2].split()[:2] == ["c1", "+15.0ms"]


def test_a_single_run_with_the_filter_on_is_what_the_targets_judge() -> None:
    on = _run((1, 16), safety=True, mesh_ttft_s=0.057)
    body = json.loads(_report((1, 16), on).to_json())
    assert body["targets_measured_on"] == targets_measured_on(True, "off")
    assert body["targets_measured_on"].startswith(TARGETS_MEASURED_ON[True])
    assert "with_output_filter" not in body
    assert body["ratios"]["c16"]["added_ttft_p50_ms"] == pytest.approx(17.0)
    assert body["targets_met"]["added_ttft_p50"] is False
    assert set(body["setup"]["runs"]) == {"with_output_filter"}


def test_the_default_path_targets_are_judged_on_the_run_with_the_output_filter() -> None:
    levels = (16, 64)
    off = _run(levels)
    body = json.loads(_report(levels, off, _run(levels, safety=True, mesh_ttft_s=0.041)).to_json())
    assert body["default_path_targets"] == DefaultPathTargets().as_dict()
    met = body["default_path_targets_met"]
    assert met["c16_added_ttft_p50"] is True and met["c16_added_ttft_p99"] is True
    assert met["c64_added_ttft_p50"] is True
    # Direct's wall is 2.0 s, the mesh's 2.5 s: 80% of its throughput.
    assert met["c64_output_tok_s"] is False
    # No hop table was scraped: the sum is not judged, and the whole is not met.
    assert met["c16_hops_sum"] is None and met["all"] is False
    # 3 ms at the median, 6 ms at the tail: over the median's 2 ms, within the tail's 10.
    slow = _run(levels, safety=True, mesh_ttft_s=0.043, mesh_tail_s=0.046)
    verdicts = json.loads(_report(levels, off, slow).to_json())["default_path_targets_met"]
    assert (verdicts["c16_added_ttft_p50"], verdicts["c16_added_ttft_p99"]) == (False, True)
    table = _report(levels, off, slow).to_table().splitlines()
    (line,) = [line for line in table if line.startswith("default-path targets")]
    assert line.endswith(
        "c16_added_ttft_p50 missed, c16_added_ttft_p99 met, c64_added_ttft_p50 met, "
        "c64_output_tok_s missed, c16_hops_sum -, all missed"
    )
    # Without a run with the filter on there is no default path to judge.
    assert "default_path_targets_met" not in json.loads(_report(levels, off).to_json())


@pytest.mark.parametrize(("unaccounted", "met"), [(-0.9, True), (1.2, False), (None, False)])
def test_the_hop_table_must_sum_to_the_client_side_figure_within_a_millisecond(
    unaccounted: float | None, met: bool
) -> None:
    level = {"added_ttft_p50_ms": 1.0, "added_ttft_p99_ms": 9.0, "output_tok_s_ratio": 0.98}
    table = cast(HopTable, {"unaccounted_mean_ms": unaccounted})
    verdicts = DefaultPathTargets().met({"c16": level, "c64": level}, {"mesh/c16": table})
    assert verdicts["c16_hops_sum"] is met and verdicts["all"] is met


def test_failed_requests_in_either_run_are_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    levels = (1,)
    failed = _records(0.057, 0.016, 4, 3)
    failed[0].fail("region lost")
    on = OverheadRun(True, {**_run(levels).results, key("mesh", 1): PathMetrics.of(failed, 1.0)})
    report = _report(levels, _run(levels), on)
    assert report.errors() == 1

    monkeypatch.setattr(overhead.OverheadBench, "run", lambda self: _done(report))
    scenario = overhead.overhead_scenario(OverheadBenchPlan(levels=levels), lambda line: None)
    assert scenario(tmp_path) == (report, "1 requests failed")
    clean = _report(levels, _run(levels), _run(levels, safety=True))
    monkeypatch.setattr(overhead.OverheadBench, "run", lambda self: _done(clean))
    assert scenario(tmp_path) == (clean, None)


async def _done(report: OverheadReport) -> OverheadReport:
    return report


# ---------------------------------------------------------------- end to end


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_quick_overhead_run_measures_the_transport_mtls_and_the_filter_through_the_real_mesh(
    tmp_path: Path,
) -> None:
    llmmesh = Path(sys.executable).parent / "llmmesh"
    done = subprocess.run(
        [str(llmmesh), "bench", "overhead", "--json", "--quick", "--log-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=290,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "llmmesh bench: transport: " in done.stderr
    assert "llmmesh bench: with_output_filter: " in done.stderr
    assert "planes on mTLS" in done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["scenario"] == "overhead"
    assert report["targets_measured_on"] == targets_measured_on(False, "both")
    runs = report["setup"]["runs"]
    assert (runs["transport"]["safety_backends"], runs["with_output_filter"]["safety_backends"]) == (
        "none",
        "rules",
    )
    assert (runs["transport"]["tls"], runs["with_output_filter"]["tls"]) == ("both", "off")
    # Each run had its own meshes, their logs in a folder of their own; the
    # mTLS planes were given the certificates the benchmark issued.
    for folder in ("transport/mesh", "transport/mesh_twin", "transport/mesh_mtls", "with_output_filter/mesh"):
        assert list((tmp_path / folder).glob("*-region.log")), folder
    assert not (tmp_path / "with_output_filter" / "mesh_mtls").exists()
    assert (tmp_path / "certs" / "ca.pem").is_file()
    filtered = report["with_output_filter"]
    for results, all_ratios, systems in (
        (report["results"], report["ratios"], ("direct", "mesh", "mesh_twin", "mesh_mtls")),
        (filtered["results"], filtered["ratios"], ("direct", "mesh")),
    ):
        assert set(results) == {f"{system}/c{level}" for system in systems for level in (1, 2)}
        for figures in results.values():
            assert figures["requests"] == 4 and figures["errors"] == 0
            assert figures["output_tokens"] > 0 and figures["ttft_p50_s"] is not None
        for level in ("c1", "c2"):
            mesh, direct = results[f"mesh/{level}"], results[f"direct/{level}"]
            assert mesh["output_tokens"] == direct["output_tokens"]
            ratios = all_ratios[level]
            assert ratios["length_mismatches"] == 0
            added = (mesh["ttft_p50_s"] - direct["ttft_p50_s"]) * 1000
            assert ratios["added_ttft_p50_ms"] == pytest.approx(added, abs=0.01)
            share = mesh["output_tok_s"] / direct["output_tok_s"]
            assert ratios["output_tok_s_ratio"] == pytest.approx(share, abs=0.001)
            assert isinstance(ratios["added_ttft_after_idle_ms"], float)
    for level in ("c1", "c2"):
        mtls, twin, plain, ratios = (
            report["results"][f"mesh_mtls/{level}"],
            report["results"][f"mesh_twin/{level}"],
            report["results"][f"mesh/{level}"],
            report["ratios"][level],
        )
        assert mtls["output_tokens"] == twin["output_tokens"] == plain["output_tokens"]
        added = (mtls["ttft_p50_s"] - twin["ttft_p50_s"]) * 1000
        assert ratios["mtls_added_ttft_p50_ms"] == pytest.approx(added, abs=0.01)
        twin_added = (twin["ttft_p50_s"] - plain["ttft_p50_s"]) * 1000
        assert ratios["twin_added_ttft_p50_ms"] == pytest.approx(twin_added, abs=0.01)
        low, high = ratios["mtls_added_ttft_p50_ci95_low_ms"], ratios["mtls_added_ttft_p50_ci95_high_ms"]
        assert low <= high
        assert isinstance(ratios["mtls_added_ttft_p99_ms"], float)
        assert isinstance(ratios["mtls_added_ttft_after_idle_ms"], float)
        assert not any(name.startswith("mtls") for name in filtered["ratios"][level])
    for level in ("c1", "c2"):
        on, off = filtered["ratios"][level], report["ratios"][level]
        expected = on["added_ttft_p50_ms"] - off["added_ttft_p50_ms"]
        assert filtered["filter_added_ttft_p50_ms"][level] == pytest.approx(expected, abs=0.001)
    # Every mesh's rounds read the CPU its processes and the client used, direct's its pod's.
    tables = [*report["hops"].values(), *filtered["hops"].values()]
    assert len(tables) == 2 * 3 + 2 * 1
    for table in tables:
        assert set(table["cpu_us_per_token"]) == {"edge", "region", "engine", "global", "client", "total"}
        assert set(table["direct_cpu_us_per_token"]) == {"engine", "client", "total"}
        assert all(value >= 0 for value in table["cpu_us_per_token"].values())
    assert sum(table["cpu_us_per_token"]["total"] for table in tables) > 0
    # The targets are at concurrency 16, which this run leaves out.
    assert set(report["targets_met"].values()) == {None}


def test_quick_traced_run_exports_the_traced_meshs_spans_and_reports_what_tracing_adds(
    tmp_path: Path,
) -> None:
    llmmesh = Path(sys.executable).parent / "llmmesh"
    flags = ["--quick", "--tls", "off", "--safety", "off", "--tracing", "both", "--concurrency", "1"]
    done = subprocess.run(
        [str(llmmesh), "bench", "overhead", "--json", *flags, "--requests", "4", "--log-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=290,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "tracing to http://127.0.0.1:" in done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    run = report["setup"]["runs"]["transport"]
    assert run["tracing"] == "both"
    # The traced planes exported their spans to the benchmark's collector.
    assert run["traced_spans_exported"] > 0
    systems = ("direct", "mesh", "mesh_twin", "mesh_traced", "mesh_unsampled")
    assert set(report["results"]) == {f"{system}/c1" for system in systems}
    traced, unsampled, twin, ratios = (
        report["results"]["mesh_traced/c1"],
        report["results"]["mesh_unsampled/c1"],
        report["results"]["mesh_twin/c1"],
        report["ratios"]["c1"],
    )
    # Each of the two rounds of two requests had one turn sampled and one not.
    assert traced["requests"] == unsampled["requests"] == 2
    assert traced["errors"] == unsampled["errors"] == 0
    assert traced["output_tokens"] + unsampled["output_tokens"] == twin["output_tokens"] > 0
    added = (traced["ttft_p50_s"] - unsampled["ttft_p50_s"]) * 1000
    assert ratios["traced_added_ttft_p50_ms"] == pytest.approx(added, abs=0.01)
    against_twin = (traced["ttft_p50_s"] - twin["ttft_p50_s"]) * 1000
    assert ratios["traced_vs_twin_added_ttft_p50_ms"] == pytest.approx(against_twin, abs=0.01)
    assert ratios["traced_added_ttft_p50_ci95_low_ms"] <= ratios["traced_added_ttft_p50_ci95_high_ms"]
    # Only the traced mesh's planes trace, its global plane (billing, routing) included.
    for system in ("mesh", "mesh_twin", "mesh_traced"):
        for plane in ("edge", "global"):
            [plane_log] = (tmp_path / "transport" / system).glob(f"*-{plane}.log")
            traces = "tracing to http://" in plane_log.read_text(errors="replace")
            assert traces == (system == "mesh_traced"), (system, plane)
