"""``llmmesh bench routing --workload prefill-heavy``: long unique documents
mixed with long chat replies, the KV sized for a full batch, ITL p90 beside
TTFT p90 and throughput with and without prefill and decode pods, and no
target for it (its figures are reported as they are)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmmesh.bench.plan import SIM_ROUTING, RoutingBenchPlan
from llmmesh.bench.routing import sim_workload
from llmmesh.bench.routing_clients import PrefixCacheCounts
from llmmesh.bench.routing_prefill_heavy import (
    CHAT,
    DOCUMENT,
    SIM_PREFILL_HEAVY,
    SUMMARY_TOKENS,
    PrefillHeavyWorkload,
    batch_kv_blocks,
)
from llmmesh.bench.routing_report import BackendReport, ItlTail, RoutingReport, SystemResult, system_name
from llmmesh.bench.routing_workload import sim_token_counter
from llmmesh.bench.stats import LevelMetrics, RequestRecord
from llmmesh.cli.bench import routing_plan_from_args
from llmmesh.cli.main import build_parser
from llmmesh.engine.sim.kv_blocks import full_block_hashes
from llmmesh.engine.sim.tokenizer import SimTokenizer

SMALL = PrefillHeavyWorkload(documents=6, document_words=(300, 500), reply_tokens=64)


def test_documents_and_chats_are_mixed_unique_and_seeded() -> None:
    turns = [turn for conversation in SMALL.conversations("measure") for turn in conversation.turns]
    assert turns == [t for c in SMALL.conversations("measure") for t in c.turns]
    assert len(turns) == SMALL.turns_total == 12
    kinds = [turn.tenant for turn in turns]
    assert kinds.count(DOCUMENT) == kinds.count(CHAT) == 6 and kinds != sorted(kinds)
    for turn in turns:
        assert len(turn.messages) == 1 and turn.messages[0][0] == "user"
        words = len(turn.messages[0][1].split())
        if turn.tenant == DOCUMENT:
            assert turn.max_tokens == SUMMARY_TOKENS and 300 <= words - 4 <= 500
        else:
            assert turn.max_tokens == 64 and words < 100
    # No two prompts share even their first KV block: nothing to reuse.
    tokenizer = SimTokenizer()
    first_blocks = {
        full_block_hashes(tokenizer.render_chat(turn.messages, True), 16)[0]
        for turn in turns
        if turn.tenant == DOCUMENT
    }
    assert len(first_blocks) == 6
    warmup = SMALL.conversations("warmup", 1)
    assert [c.tenant for c in warmup].count(DOCUMENT) == 1 and len(warmup) == 2
    assert not {t.messages for c in warmup for t in c.turns} & {t.messages for t in turns}
    assert SMALL.describe()["kind"] == "prefill-heavy"
    with pytest.raises(ValueError, match="must be positive"):
        PrefillHeavyWorkload(documents=0, document_words=(1, 2), reply_tokens=8)


def test_the_kv_cache_holds_a_full_batch_of_the_longest_turn() -> None:
    workload, working, blocks = sim_workload(SIM_PREFILL_HEAVY)
    assert isinstance(workload, PrefillHeavyWorkload) and workload.documents == 24
    assert working.shared_prefix_tokens == 0
    assert working.longest_turn_tokens > SIM_PREFILL_HEAVY.system_words
    assert blocks == batch_kv_blocks(working.longest_turn_tokens, 8, 16)
    assert blocks * 16 >= 8 * working.longest_turn_tokens
    assert batch_kv_blocks(33, 2, 16) == 6
    fixed = sim_workload(dataclasses.replace(SIM_PREFILL_HEAVY, kv_blocks=500))
    assert fixed[2] == 500
    counted = SMALL.working_set(2, sim_token_counter())
    assert counted.live_conversation_tokens > 2 * 64


def test_prefill_heavy_flags_and_refusals() -> None:
    parse = build_parser().parse_args
    flags = ["bench", "routing", "--workload", "prefill-heavy", "--backend", "sim"]
    plan = routing_plan_from_args(parse(flags))
    assert plan.vllm is None and plan.sim == SIM_PREFILL_HEAVY
    assert plan.sim.policies == ("precise",) and plan.sim.disaggregated == ("precise",)
    quick = routing_plan_from_args(parse([*flags, "--quick"]))
    assert quick.sim is not None and quick.sim.workload == "prefill-heavy"
    with pytest.raises(ValueError, match="simulator only"):
        routing_plan_from_args(parse(["bench", "routing", "--workload", "prefill-heavy"]))
    with pytest.raises(ValueError, match="simulator only"):
        RoutingBenchPlan(
            sim=None, vllm=dataclasses.replace(SIM_ROUTING, workload="prefill-heavy", disaggregated=())
        )
    with pytest.raises(ValueError, match="workload must be one of"):
        dataclasses.replace(SIM_ROUTING, workload="decode-heavy")
    with pytest.raises(SystemExit):
        parse(["bench", "routing", "--workload", "decode-heavy"])


def _result(ttft_p90: float, itl_p90: float, tok_s: float) -> SystemResult:
    metrics = LevelMetrics(10, 0, 100, 2.0, tok_s, ttft_p90 / 2, ttft_p90, ttft_p90, itl_p90 / 2)
    return SystemResult(metrics, PrefixCacheCounts(100.0, 0.0), ItlTail(itl_p90, 2 * itl_p90))


def test_the_report_gives_itl_p90_beside_ttft_and_throughput_and_no_target() -> None:
    systems = {
        system_name("precise"): _result(0.4, 0.2, 100.0),
        system_name("precise+pd"): _result(0.3, 0.01, 80.0),
    }
    sim = BackendReport("sim", 16, {"backend": "sim"}, SMALL.describe(), {"pods": 4}, systems)
    report = RoutingReport("llmmesh-tiny", "what", sim, None)
    ratios = report.ratios()
    assert ratios["sim_disaggregated_over_precise_itl_p90"] == pytest.approx(0.05)
    assert ratios["sim_disaggregated_over_precise_itl_p99"] == pytest.approx(0.05)
    assert ratios["sim_disaggregated_over_precise_ttft_p90"] == pytest.approx(0.75)
    assert ratios["sim_disaggregated_over_precise_output_tok_s"] == pytest.approx(0.8)
    assert report.targets_met() == {"sim": None, "vllm": None}
    figures = json.loads(report.to_json())["backends"]["sim"]["systems"]["llmmesh/precise+pd"]
    assert (figures["itl_p90_s"], figures["itl_p99_s"]) == (0.01, 0.02)
    assert "itl p90" in report.to_table()


def test_itl_tail_is_taken_over_good_turns_only() -> None:
    good = RequestRecord(
        sent_at=0.0, chunks=[(0.1, 1)] + [(0.1 + 0.01 * n, 1) for n in range(1, 10)], finished_at=1.0
    )
    stalled = RequestRecord(sent_at=0.0, chunks=[(0.1, 1), (0.2, 1), (1.2, 1)], finished_at=1.3)
    failed = RequestRecord(sent_at=0.0, chunks=[(0.1, 1), (5.0, 1)], error="broken")
    tail = ItlTail.of([good, stalled, failed])
    assert tail.p90_s is not None and tail.p99_s is not None
    assert 0.01 <= tail.p90_s <= 1.0 < 5.0 and tail.p99_s <= 1.0
    assert ItlTail.of([failed]) == ItlTail()


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_tiny_prefill_heavy_run_on_the_simulator() -> None:
    llmmesh = Path(sys.executable).parent / "llmmesh"
    flags = ["--workload", "prefill-heavy", "--backend", "sim", "--quick", "--pods", "2", "--users", "2"]
    flags += ["--conversations", "2", "--max-tokens", "24", "--warmup", "0"]
    done = subprocess.run(
        [str(llmmesh), "bench", "routing", "--json", *flags],
        capture_output=True,
        text=True,
        timeout=230,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    sim = report["backends"]["sim"]
    assert sim["workload"]["kind"] == "prefill-heavy"
    assert set(sim["systems"]) == {"llmmesh/precise", "llmmesh/precise+pd"}
    for figures in sim["systems"].values():
        assert figures["requests"] == 4 and figures["errors"] == 0
        assert figures["output_tokens"] == 2 * SUMMARY_TOKENS + 2 * 24
        assert figures["itl_p90_s"] is not None and figures["ttft_p90_s"] is not None
    assert report["ratios"]["sim_disaggregated_over_precise_itl_p90"] is not None
    assert report["targets_met"] == {"sim": None, "vllm": None}
