"""Conversions between the backend's dataclasses and the wire messages of
``EngineService``; the only engine module besides the servicer that knows
protobuf."""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf import timestamp_pb2

from engine.backend import (
    ChatTurn,
    EngineInfo,
    FinishReason,
    GeneratedTokens,
    GenerationFinished,
    GenerationStarted,
    HealthState,
    LoadSnapshot,
    SamplingOptions,
)
from engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from llmmesh.chat_tokenizer import chat_role_name
from llmmesh.v1 import common_pb2
from llmmesh.v1 import engine_service_pb2 as pb

_FINISH_REASONS = {
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.CANCELLED: common_pb2.FINISH_REASON_CANCELLED,
}
_HEALTH = {
    HealthState.SERVING: common_pb2.HEALTH_STATE_SERVING,
    HealthState.DOWN: common_pb2.HEALTH_STATE_DOWN,
}


def chat_turns(messages: Iterable[common_pb2.ChatMessage]) -> list[ChatTurn]:
    """Chat messages as turns; an unspecified role becomes ``"unspecified"``,
    which the chat template rejects."""
    return [ChatTurn(chat_role_name(message.role), message.content) for message in messages]


def sampling_options(params: common_pb2.SamplingParams) -> SamplingOptions:
    """Sampling options; unset optional fields stay ``None``."""
    return SamplingOptions(
        max_tokens=params.max_tokens if params.HasField("max_tokens") else None,
        temperature=params.temperature if params.HasField("temperature") else None,
        top_p=params.top_p if params.HasField("top_p") else None,
        stop=tuple(params.stop),
        seed=params.seed if params.HasField("seed") else None,
        ignore_eos=params.ignore_eos,
    )


def started(request_id: str, pod_id: str, event: GenerationStarted) -> pb.GenerateStarted:
    return pb.GenerateStarted(
        request_id=request_id,
        pod_id=pod_id,
        prompt_tokens=event.prompt_tokens,
        cached_prompt_tokens=event.cached_prompt_tokens,
    )


def delta(sequence: int, event: GeneratedTokens) -> pb.TokenDelta:
    return pb.TokenDelta(
        sequence=sequence,
        text=event.text,
        token_ids=event.token_ids,
        output_token_offset=event.output_token_offset,
    )


def finished(request_id: str, event: GenerationFinished) -> pb.GenerateFinished:
    return pb.GenerateFinished(
        request_id=request_id,
        reason=_FINISH_REASONS[event.reason],
        usage=common_pb2.TokenUsage(
            input_tokens=event.prompt_tokens,
            output_tokens=event.output_tokens,
            cached_input_tokens=event.cached_prompt_tokens,
        ),
        matched_stop=event.matched_stop,
    )


def engine_info_response(info: EngineInfo) -> pb.GetEngineInfoResponse:
    return pb.GetEngineInfoResponse(
        pod_id=info.pod_id,
        instance_id=info.instance_id,
        backend=info.backend,
        model=info.model,
        context_window=info.context_window,
        block_size=info.block_size,
        max_num_seqs=info.max_num_seqs,
        kv_blocks_total=info.kv_blocks_total,
    )


def load_report(pod_id: str, load: LoadSnapshot) -> pb.LoadReport:
    """A load report stamped now."""
    now = timestamp_pb2.Timestamp()
    now.GetCurrentTime()
    return pb.LoadReport(
        pod_id=pod_id,
        report_time=now,
        running=load.running,
        waiting=load.waiting,
        kv_cache_usage=load.kv_cache_usage,
        prefix_cache_queries=load.prefix_cache_queries,
        prefix_cache_hits=load.prefix_cache_hits,
        gpu=pb.GpuTelemetry(
            available=load.gpu.available,
            unavailable_reason=load.gpu.unavailable_reason,
            devices=[
                pb.GpuDevice(
                    index=device.index,
                    name=device.name,
                    utilization_percent=device.utilization_percent,
                    memory_used_bytes=device.memory_used_bytes,
                    memory_total_bytes=device.memory_total_bytes,
                )
                for device in load.gpu.devices
            ],
        ),
        health=_HEALTH[load.health],
    )


def kv_event(event: KvEvent) -> pb.KvEvent:
    message = pb.KvEvent(sequence=event.sequence)
    message.event_time.FromNanoseconds(int(event.timestamp * 1e9))
    payload = event.payload
    if isinstance(payload, BlockStored):
        message.block_stored.CopyFrom(
            pb.BlockStored(
                block_hashes=payload.block_hashes,
                parent_block_hash=payload.parent_block_hash,
                token_ids=payload.token_ids,
                block_size=payload.block_size,
                medium=payload.medium,
            )
        )
    elif isinstance(payload, BlockRemoved):
        message.block_removed.CopyFrom(
            pb.BlockRemoved(block_hashes=payload.block_hashes, medium=payload.medium)
        )
    elif isinstance(payload, AllBlocksCleared):
        message.all_blocks_cleared.SetInParent()
    return message
