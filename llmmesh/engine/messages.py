"""Conversions between the backend's dataclasses and the wire messages of
``EngineService``; the only engine module besides the servicer that knows
protobuf."""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf import timestamp_pb2

from llmmesh.core.chat_tokenizer import chat_role_name
from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.engine.backend import (
    ChatTurn,
    EngineInfo,
    FinishReason,
    GeneratedTokens,
    GenerationFinished,
    GenerationStarted,
    HealthState,
    KvTransferSpec,
    LoadSnapshot,
    ResponseFormatSpec,
    ResponseFormatType,
    SamplingOptions,
    TokenLogprobs,
    ToolCallPart,
    ToolChoiceMode,
    ToolChoiceSpec,
    ToolSpec,
)
from llmmesh.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from llmmesh.v1 import common_pb2
from llmmesh.v1 import engine_service_pb2 as pb

_FINISH_REASONS = {
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.CANCELLED: common_pb2.FINISH_REASON_CANCELLED,
    FinishReason.TOOL_CALLS: common_pb2.FINISH_REASON_TOOL_CALLS,
}
_TOOL_CHOICE_MODES = {
    common_pb2.TOOL_CHOICE_MODE_NONE: ToolChoiceMode.NONE,
    common_pb2.TOOL_CHOICE_MODE_AUTO: ToolChoiceMode.AUTO,
    common_pb2.TOOL_CHOICE_MODE_REQUIRED: ToolChoiceMode.REQUIRED,
    common_pb2.TOOL_CHOICE_MODE_NAMED: ToolChoiceMode.NAMED,
}
_RESPONSE_FORMAT_TYPES = {
    common_pb2.RESPONSE_FORMAT_TYPE_TEXT: ResponseFormatType.TEXT,
    common_pb2.RESPONSE_FORMAT_TYPE_JSON_OBJECT: ResponseFormatType.JSON_OBJECT,
    common_pb2.RESPONSE_FORMAT_TYPE_JSON_SCHEMA: ResponseFormatType.JSON_SCHEMA,
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
    """Sampling options; unset optional fields stay ``None``.

    An unspecified tool choice becomes ``AUTO`` when tools are given and
    ``NONE`` otherwise; an unknown enum number raises ``InvalidArgument``
    (param ``tool_choice`` or ``response_format``), never a silent default."""
    return SamplingOptions(
        max_tokens=params.max_tokens if params.HasField("max_tokens") else None,
        temperature=params.temperature if params.HasField("temperature") else None,
        top_p=params.top_p if params.HasField("top_p") else None,
        stop=tuple(params.stop),
        seed=params.seed if params.HasField("seed") else None,
        ignore_eos=params.ignore_eos,
        presence_penalty=params.presence_penalty if params.HasField("presence_penalty") else None,
        frequency_penalty=params.frequency_penalty if params.HasField("frequency_penalty") else None,
        logit_bias=tuple(sorted(params.logit_bias.items())),
        logprobs=params.logprobs,
        top_logprobs=params.top_logprobs if params.HasField("top_logprobs") else None,
        tools=tuple(
            ToolSpec(tool.name, tool.description, tool.parameters_json, tool.strict) for tool in params.tools
        ),
        tool_choice=_tool_choice(params),
        parallel_tool_calls=params.parallel_tool_calls if params.HasField("parallel_tool_calls") else True,
        response_format=_response_format(params),
    )


def _tool_choice(params: common_pb2.SamplingParams) -> ToolChoiceSpec:
    choice = params.tool_choice
    if choice.mode == common_pb2.TOOL_CHOICE_MODE_UNSPECIFIED:
        if choice.name:
            # A name says which tool to call only with TOOL_CHOICE_MODE_NAMED.
            raise InvalidArgument(
                Reason.INVALID_SAMPLING,
                f"tool_choice names {choice.name!r} but sets no mode; a named choice sets mode NAMED",
                metadata={"param": "tool_choice"},
            )
        return ToolChoiceSpec(ToolChoiceMode.AUTO if params.tools else ToolChoiceMode.NONE)
    mode = _TOOL_CHOICE_MODES.get(choice.mode)
    if mode is None:
        raise InvalidArgument(
            Reason.INVALID_SAMPLING,
            f"tool_choice.mode {choice.mode} is not a tool choice mode",
            metadata={"param": "tool_choice"},
        )
    return ToolChoiceSpec(mode, choice.name)


def _response_format(params: common_pb2.SamplingParams) -> ResponseFormatSpec | None:
    response_format = params.response_format
    if response_format.type == common_pb2.RESPONSE_FORMAT_TYPE_UNSPECIFIED:
        return None
    kind = _RESPONSE_FORMAT_TYPES.get(response_format.type)
    if kind is None:
        raise InvalidArgument(
            Reason.INVALID_SAMPLING,
            f"response_format.type {response_format.type} is not a response format",
            metadata={"param": "response_format"},
        )
    return ResponseFormatSpec(
        kind, response_format.schema_name, response_format.schema_json, response_format.strict
    )


def started(request_id: str, pod_id: str, event: GenerationStarted) -> pb.GenerateStarted:
    return pb.GenerateStarted(
        request_id=request_id,
        pod_id=pod_id,
        prompt_tokens=event.prompt_tokens,
        cached_prompt_tokens=event.cached_prompt_tokens,
    )


def fill_delta(target: pb.TokenDelta, sequence: int, event: GeneratedTokens) -> pb.TokenDelta:
    """Fill ``target`` (an empty delta, or one inside the event that carries
    it, so it is not copied there) with ``event``; returns it. Fields left
    empty are not touched: a pod sends one delta per step of every generation."""
    target.SetInParent()
    target.sequence = sequence
    target.text = event.text
    target.token_ids.extend(event.token_ids)
    target.output_token_offset = event.output_token_offset
    if event.tool_calls:
        target.tool_calls.extend(tool_call_delta(part) for part in event.tool_calls)
    if event.logprobs:
        target.logprobs.extend(token_logprob(entry) for entry in event.logprobs)
    return target


def tool_call_delta(part: ToolCallPart) -> common_pb2.ToolCallDelta:
    return common_pb2.ToolCallDelta(index=part.index, id=part.id, name=part.name, arguments=part.arguments)


def token_logprob(entry: TokenLogprobs) -> common_pb2.TokenLogprob:
    return common_pb2.TokenLogprob(
        token_id=entry.token_id,
        token=entry.token,
        logprob=entry.logprob,
        token_bytes=entry.token_bytes,
        top=[
            common_pb2.TopLogprob(
                token_id=top.token_id, token=top.token, logprob=top.logprob, token_bytes=top.token_bytes
            )
            for top in entry.top
        ],
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
        kv_transfer=kv_transfer_message(event.kv_transfer) if event.kv_transfer else None,
    )


POD_ROLES = {
    "both": pb.POD_ROLE_BOTH,
    "prefill": pb.POD_ROLE_PREFILL,
    "decode": pb.POD_ROLE_DECODE,
}


def kv_transfer_message(spec: KvTransferSpec) -> pb.KvTransfer:
    return pb.KvTransfer(
        source_pod_id=spec.source_pod_id,
        source_request_id=spec.source_request_id,
        prompt_tokens=spec.prompt_tokens,
        blocks=spec.blocks,
        cached_prompt_tokens=spec.cached_prompt_tokens,
        params_json=spec.params_json,
    )


def kv_transfer_spec(message: pb.KvTransfer) -> KvTransferSpec:
    return KvTransferSpec(
        source_pod_id=message.source_pod_id,
        source_request_id=message.source_request_id,
        prompt_tokens=message.prompt_tokens,
        blocks=message.blocks,
        cached_prompt_tokens=message.cached_prompt_tokens,
        params_json=message.params_json,
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
        role=POD_ROLES[info.role],
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
