"""``llmmesh bench routing``: the workload and its KV sizing, the pods'
prefix-cache counters, the conversation driver, the report, the flags, and
one tiny run on the simulator end to end. No assertion on timing: timing
claims live in the benchmark's output."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from llmmesh.bench.openai_client import ChunkCounter
from llmmesh.bench.plan import ROUTING_POLICIES, SIM_ROUTING, VLLM_ROUTING, RoutingBenchPlan
from llmmesh.bench.routing import sim_setup, sim_workload
from llmmesh.bench.routing_clients import (
    PrefixCacheCounts,
    chat_body,
    chat_start,
    parse_prefix_counts,
    run_conversations,
    turn_trace,
)
from llmmesh.bench.routing_report import BackendReport, RoutingReport, SystemResult, system_name
from llmmesh.bench.routing_systems import Pod, pod_cores, router_command
from llmmesh.bench.routing_workload import (
    KvSizing,
    Message,
    RoutingWorkload,
    Turn,
    WorkingSet,
    blocks_for_pressure,
    sim_token_counter,
    working_set,
)
from llmmesh.bench.stats import LevelMetrics, RequestRecord
from llmmesh.cli.bench import routing_plan_from_args
from llmmesh.cli.main import build_parser
from llmmesh.v1 import common_pb2

SMALL = RoutingWorkload(
    tenants=2,
    system_words=10,
    conversations_per_tenant=1,
    turns_per_conversation=2,
    user_words=(3, 3),
    reply_words=4,
    max_tokens=4,
)
OPENER_WORDS = 8  # "Tenant N assistant. Answer for tenant N only."


def _words(messages: Sequence[Message], add_generation_prompt: bool) -> int:
    """A token counter for the sizing math: one token a word, one for the opener."""
    return sum(len(text.split()) for _, text in messages) + int(add_generation_prompt)


# ---------------------------------------------------------------- workload


def test_workload_is_a_pure_function_of_its_seed() -> None:
    first = RoutingWorkload().conversations("measure")
    assert first == RoutingWorkload().conversations("measure")
    assert first != RoutingWorkload(seed=7).conversations("measure")
    user_messages = {turn.messages[-1] for c in first for turn in c.turns}
    warmup = {turn.messages[-1] for c in RoutingWorkload().conversations("warmup") for turn in c.turns}
    assert not user_messages & warmup


def test_conversations_interleave_tenants_and_grow_their_history() -> None:
    workload = RoutingWorkload(tenants=3, conversations_per_tenant=4, turns_per_conversation=3)
    conversations = workload.conversations("measure")
    assert len(conversations) == 12
    assert sum(len(c.turns) for c in conversations) == workload.turns_total == 36
    assert [c.tenant for c in conversations] != sorted(c.tenant for c in conversations)
    for conversation in conversations:
        system = ("system", workload.system_prompts[conversation.tenant])
        for number, turn in enumerate(conversation.turns):
            assert turn.messages[0] == system
            assert [role for role, _ in turn.messages] == ["system", *["user", "assistant"] * number, "user"]
            if number:
                previous = conversation.turns[number - 1].messages
                assert turn.messages[: len(previous)] == previous


def test_tenants_share_no_first_kv_block() -> None:
    tokenizer_count = sim_token_counter()
    prompts = RoutingWorkload().system_prompts
    assert len(set(prompts)) == len(prompts)
    assert len({prompt.split(".")[0] for prompt in prompts}) == len(prompts)
    assert tokenizer_count([("system", prompts[0])], False) > 1000


def test_workload_refuses_empty_shapes() -> None:
    with pytest.raises(ValueError, match="tenants"):
        RoutingWorkload(tenants=0)
    with pytest.raises(ValueError, match="user_words"):
        RoutingWorkload(user_words=(5, 2))


# ---------------------------------------------------------------- sizing


def test_working_set_counts_prefixes_once_and_one_live_tail_per_user() -> None:
    working = working_set(SMALL, 3, _words)
    system_tokens = OPENER_WORDS + 10
    assert working.shared_prefix_tokens == 2 * system_tokens
    # Last turn: system, user 3, reply 4, user 3, opener 1; then 4 output tokens.
    longest = system_tokens + 3 + 4 + 3 + 1 + 4
    assert working.longest_turn_tokens == longest
    assert working.live_conversation_tokens == 3 * (longest - system_tokens)
    assert working.tokens == working.shared_prefix_tokens + working.live_conversation_tokens


def test_blocks_for_pressure_and_the_sizing_it_gives() -> None:
    blocks = blocks_for_pressure(7000, pods=4, block_size=16, pressure=0.7)
    assert blocks == 157  # 7000 / (0.7 * 4 * 16) = 156.25
    sizing = KvSizing(4, 16, blocks, WorkingSet(4000, 3000, 900))
    assert sizing.cluster_kv_tokens == 4 * 157 * 16
    assert sizing.kv_pressure == pytest.approx(7000 / (4 * 157 * 16))
    assert sizing.kv_pressure <= 0.7
    assert sizing.shared_prefix_over_pod_kv == pytest.approx(4000 / (157 * 16))
    assert sizing.as_dict()["working_set_tokens"] == 7000
    with pytest.raises(ValueError, match="positive"):
        blocks_for_pressure(7000, pods=0, block_size=16, pressure=0.7)


def test_default_sim_workload_overflows_one_pod_and_fits_the_cluster() -> None:
    plan = SIM_ROUTING
    workload = RoutingWorkload(
        tenants=plan.tenants,
        system_words=plan.system_words,
        conversations_per_tenant=plan.conversations_per_tenant,
        turns_per_conversation=plan.turns_per_conversation,
        max_tokens=plan.max_tokens,
        reply_words=plan.max_tokens,
    )
    working = working_set(workload, plan.concurrency, sim_token_counter())
    blocks = blocks_for_pressure(working.tokens, plan.pods, plan.block_size, plan.kv_pressure)
    sizing = KvSizing(plan.pods, plan.block_size, blocks, working)
    assert sizing.shared_prefix_over_pod_kv > 1.0
    assert 0.6 < sizing.kv_pressure <= 0.7
    assert working.longest_turn_tokens < 4096


def test_many_pods_for_few_users_still_fit_a_turn_and_too_few_kv_blocks_are_refused() -> None:
    # 1,024 pods for the default 16 users: sized to the KV pressure alone a
    # pod would hold 3 blocks, and every turn would fail; it holds the longest turn.
    many = dataclasses.replace(SIM_ROUTING, pods=1024)
    _, working, blocks = sim_workload(many)
    assert blocks * many.block_size >= working.longest_turn_tokens
    with pytest.raises(ValueError, match="--kv-blocks 2 gives a pod 32 tokens"):
        sim_setup(dataclasses.replace(SIM_ROUTING, kv_blocks=2))


# ---------------------------------------------------------------- clients


def test_requests_carry_the_whole_history() -> None:
    turn = SMALL.conversations("measure")[0].turns[1]
    start = chat_start(turn, "llmmesh-tiny").start
    assert [m.role for m in start.messages] == [
        common_pb2.CHAT_ROLE_SYSTEM,
        common_pb2.CHAT_ROLE_USER,
        common_pb2.CHAT_ROLE_ASSISTANT,
        common_pb2.CHAT_ROLE_USER,
    ]
    assert start.sampling.ignore_eos and start.sampling.max_tokens == 4
    body = chat_body("llmmesh-tiny", turn)
    assert [m["content"] for m in body["messages"]] == [text for _, text in turn.messages]
    assert body["ignore_eos"] is True and body["stream"] is True


EXPOSITION = """\
# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="llmmesh-tiny"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="llmmesh-tiny"} 500.0
vllm:prefix_cache_queries_created{engine="0",model_name="llmmesh-tiny"} 1.7e9
# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="llmmesh-tiny"} 600.0
# HELP vllm:num_requests_running Running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llmmesh-tiny"} 3.0
"""


def test_prefix_counters_are_summed_over_label_sets() -> None:
    counts = parse_prefix_counts(EXPOSITION)
    assert counts == PrefixCacheCounts(1500.0, 600.0)
    delta = counts - PrefixCacheCounts(500.0, 100.0)
    assert delta.hit_rate == pytest.approx(0.5)
    assert PrefixCacheCounts().hit_rate is None
    assert parse_prefix_counts("") == PrefixCacheCounts()


class _RecordingClient:
    """Answers every turn at once and records the order turns came in."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def chat(self, turn: Turn) -> RequestRecord:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.seen.append(turn.turn_id)
        record = RequestRecord(sent_at=0.0)
        await asyncio.sleep(0)
        record.add_tokens(0.01, turn.max_tokens)
        record.finish(0.02)
        self.in_flight -= 1
        return record

    async def close(self) -> None:
        return None


@pytest.mark.asyncio
async def test_users_send_a_conversations_turns_in_order_and_stay_bounded() -> None:
    workload = RoutingWorkload(tenants=3, conversations_per_tenant=3, turns_per_conversation=3, max_tokens=2)
    conversations = workload.conversations("measure")
    client = _RecordingClient()
    progress: list[int] = []
    run = await run_conversations(client, conversations, 2, lambda done, total: progress.append(done))
    assert len(run.records) == 27 and all(record.ok for record in run.records)
    assert progress == list(range(1, 28))
    assert client.most_in_flight <= 2
    for conversation in conversations:
        ids = [turn.turn_id for turn in conversation.turns]
        assert [turn_id for turn_id in client.seen if turn_id in ids] == ids
    with pytest.raises(ValueError, match="concurrency"):
        await run_conversations(client, conversations, 0)


def test_router_command_subscribes_kv_aware_to_every_pod() -> None:
    pods = [Pod(f"p{i}", f"http://127.0.0.1:{8000 + i}", "", f"tcp://127.0.0.1:{9000 + i}") for i in range(2)]
    kv_aware = router_command("vllm-router", "kv_aware", pods, 7000, "llmmesh-tiny", 128)
    assert kv_aware[kv_aware.index("--policy") + 1] == "kv_aware"
    sources = [kv_aware[i + 1] for i, arg in enumerate(kv_aware) if arg == "--kv-event-source"]
    assert sources == [
        "http://127.0.0.1:8000=tcp://127.0.0.1:9000",
        "http://127.0.0.1:8001=tcp://127.0.0.1:9001",
    ]
    assert kv_aware[kv_aware.index("--kv-event-block-size") + 1] == "128"
    cache_aware = router_command("vllm-router", "cache_aware", pods, 7000, "llmmesh-tiny", 128)
    assert "--kv-event-source" not in cache_aware


# ---------------------------------------------------------------- report


def _result(ttft_p90: float | None, queries: float = 100.0, hits: float = 50.0) -> SystemResult:
    metrics = LevelMetrics(
        requests=10,
        errors=0,
        output_tokens=100,
        wall_s=2.0,
        output_tok_s=50.0,
        ttft_p50_s=None if ttft_p90 is None else ttft_p90 / 2,
        ttft_p90_s=ttft_p90,
        ttft_p99_s=ttft_p90,
        itl_p50_s=0.01,
    )
    return SystemResult(metrics, PrefixCacheCounts(queries, hits))


def _backend(name: str, systems: dict[str, SystemResult]) -> BackendReport:
    return BackendReport(name, 4, {"backend": name}, {"tenants": 2}, {"pods": 2, "kv_pressure": 0.7}, systems)


def test_ratios_and_targets() -> None:
    sim = _backend("sim", {system_name("precise"): _result(0.1), system_name("round_robin"): _result(0.6)})
    vllm = _backend(
        "vllm",
        {
            system_name("precise"): _result(0.2, hits=80.0),
            system_name("kv_aware", peer=True): _result(0.25, hits=70.0),
        },
    )
    report = RoutingReport("llmmesh-tiny", "what", sim, vllm)
    ratios = report.ratios()
    assert ratios["sim_round_robin_over_precise_ttft_p90"] == pytest.approx(6.0)
    assert ratios["vllm_precise_over_kv_aware_ttft_p90"] == pytest.approx(0.8)
    assert ratios["vllm_precise_minus_kv_aware_hit_rate"] == pytest.approx(0.1)
    assert report.targets_met() == {"sim": True, "vllm": True}
    slow = RoutingReport(
        "m",
        "what",
        _backend("sim", {"llmmesh/precise": _result(0.1), "llmmesh/round_robin": _result(0.4)}),
        None,
    )
    assert slow.targets_met() == {"sim": False, "vllm": None}


def test_a_missing_system_fails_its_target_and_the_json_stays_strict() -> None:
    vllm = _backend("vllm", {system_name("precise"): _result(0.2)})
    report = RoutingReport("llmmesh-tiny", "what", None, vllm)
    assert report.ratios()["vllm_precise_over_kv_aware_ttft_p90"] is None
    assert report.targets_met() == {"sim": None, "vllm": False}
    payload = json.loads(report.to_json())
    assert payload["scenario"] == "routing"
    assert set(payload["backends"]) == {"vllm"}
    system = payload["backends"]["vllm"]["systems"]["llmmesh/precise"]
    assert system["prefix_hit_rate"] == 0.5 and system["requests"] == 10
    assert "llmmesh/precise" in report.to_table()


# ---------------------------------------------------------------- flags


def test_routing_flags() -> None:
    plan = routing_plan_from_args(build_parser().parse_args(["bench", "routing"]))
    assert plan.sim == SIM_ROUTING and plan.vllm == VLLM_ROUTING
    assert plan.sim.policies == ROUTING_POLICIES and plan.sim.pods == 4 and plan.vllm.pods == 2
    quick = routing_plan_from_args(
        build_parser().parse_args(
            ["bench", "routing", "--quick", "--backend", "sim", "--pods", "2", "--policies", "precise"]
        )
    )
    assert quick.vllm is None and quick.sim is not None
    assert quick.sim.pods == 2 and quick.sim.policies == ("precise",)
    assert quick.sim.tenants < SIM_ROUTING.tenants
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "routing", "--policies", "fastest"])
    assert plan.sim.disaggregated == ("precise",)
    whole = routing_plan_from_args(build_parser().parse_args(["bench", "routing", "--no-disaggregation"]))
    assert whole.sim is not None and whole.sim.disaggregated == ()


def test_disaggregation_is_compared_with_precise_at_the_same_pod_count() -> None:
    sim = _backend(
        "sim",
        {
            system_name("precise"): _result(0.2),
            system_name("round_robin"): _result(1.2),
            system_name("precise+pd"): _result(0.1),
        },
    )
    ratios = RoutingReport("llmmesh-tiny", "what", sim, None).ratios()
    assert ratios["sim_disaggregated_over_precise_ttft_p90"] == pytest.approx(0.5)
    assert ratios["sim_disaggregated_over_precise_output_tok_s"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least 2 pods"):
        dataclasses.replace(SIM_ROUTING, pods=1)
    with pytest.raises(ValueError, match="simulator only"):
        RoutingBenchPlan(vllm=dataclasses.replace(VLLM_ROUTING, disaggregated=("precise",)))


# ---------------------------------------------------------------- end to end


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_tiny_routing_run_on_the_simulator() -> None:
    llmmesh = Path(sys.executable).parent / "llmmesh"
    flags = ["--quick", "--backend", "sim", "--pods", "2", "--users", "2", "--tenants", "2"]
    flags += ["--conversations", "1", "--policies", "precise,round_robin", "--max-tokens", "8"]
    done = subprocess.run(
        [str(llmmesh), "bench", "routing", "--json", *flags],
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["scenario"] == "routing"
    sim = report["backends"]["sim"]
    assert sim["pods"] == 2 and sim["kv"]["kv_blocks_per_pod"] == sim["engine"]["kv_blocks"]
    # precise once more on one prefill and one decode pod.
    assert set(sim["systems"]) == {"llmmesh/precise", "llmmesh/round_robin", "llmmesh/precise+pd"}
    for figures in sim["systems"].values():
        assert figures["requests"] == 2 * 3 and figures["errors"] == 0
        assert figures["output_tokens"] == 2 * 3 * 8
        assert figures["ttft_p90_s"] is not None
        assert 0.0 <= figures["prefix_hit_rate"] <= 1.0
        assert figures["prefix_cache_queries"] > 0
    assert report["ratios"]["sim_round_robin_over_precise_ttft_p90"] is not None
    assert report["ratios"]["sim_disaggregated_over_precise_ttft_p90"] is not None
    assert report["ratios"]["sim_disaggregated_over_precise_output_tok_s"] is not None
    assert isinstance(report["targets_met"]["sim"], bool)
    assert report["targets_met"]["vllm"] is None


def test_chunk_counter_counts_usage_on_every_chunk_or_only_at_the_end() -> None:
    every = ChunkCounter()
    chunks = [{"choices": [{"delta": {"content": "a"}}], "usage": {"completion_tokens": n}} for n in (1, 3)]
    assert [every.tokens_in(chunk) for chunk in chunks] == [1, 2]
    at_end = ChunkCounter()
    content = [{"choices": [{"delta": {"content": "a"}}]} for _ in range(3)]
    counts = [at_end.tokens_in(chunk) for chunk in content]
    counts.append(at_end.tokens_in({"choices": [], "usage": {"completion_tokens": 4}}))
    assert counts == [1, 1, 1, 1] and at_end.counted == 4


def test_each_vllm_pod_gets_its_own_share_of_the_cores() -> None:
    assert [pod_cores(i, 2, [0, 1]) for i in range(2)] == [[0], [1]]
    assert [pod_cores(i, 2, [0, 1, 2, 3, 4]) for i in range(2)] == [[0, 1], [2, 3]]
    # More pods than cores: shared round robin, never an empty list.
    assert [pod_cores(i, 3, [4, 6]) for i in range(3)] == [[4], [6], [4]]


def test_the_turn_trace_names_each_turn_its_pod_and_its_ttft() -> None:
    workload = RoutingWorkload(
        tenants=2, system_words=20, conversations_per_tenant=1, turns_per_conversation=2, max_tokens=4
    )
    conversations = workload.conversations("measure")
    records = []
    for n, _turn in enumerate(t for c in conversations for t in c.turns):
        record = RequestRecord(sent_at=10.0 + n, served_by=f"pod-{n % 2}")
        if n != 1:
            record.add_tokens(10.25 + n, 3)
        else:
            record.fail("UNAVAILABLE: gone")
        records.append(record)
    lines = turn_trace(conversations, records, started_at=10.0)
    assert [line["turn_id"] for line in lines] == [t.turn_id for c in conversations for t in c.turns]
    assert lines[0] == {
        "turn_id": lines[0]["turn_id"],
        "tenant": conversations[0].tenant,
        "sent_s": 0.0,
        "ttft_s": 0.25,
        "output_tokens": 3,
        "pod": "pod-0",
        "error": None,
    }
    assert lines[1]["ttft_s"] is None and lines[1]["error"] == "UNAVAILABLE: gone"
    json.dumps(lines)
