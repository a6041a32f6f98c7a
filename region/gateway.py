"""The region gateway: one chat turn from an authenticated start message to
its metered end, across the engine pod that serves it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc
import grpc.aio
from google.protobuf import timestamp_pb2

from llmmesh.errors import MeshError, Reason, Unavailable, from_rpc_error
from llmmesh.ids import new_id
from llmmesh.model_resolver import ModelResolver
from llmmesh.pricing import format_usd
from llmmesh.tasks import cancel_and_wait
from llmmesh.v1 import (
    billing_service_pb2,
    chat_service_pb2,
    common_pb2,
    engine_service_pb2,
    model_registry_service_pb2,
)
from region.engine_pool import EnginePodHandle, EnginePool
from region.fair_queue import engine_priority
from region.model_policy import require_allowed, turn_cost
from region.policy_cache import Caller, PolicyCache
from region.settings import RegionSettings
from region.usage_shipper import UsageShipper
from region.validation import validate_start
from region.zone_store.rows import AssistantMessage
from region.zone_store.store import ZoneStore

log = logging.getLogger(__name__)

_RETRYABLE_BEFORE_OUTPUT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})


class _PodFailedEarly(Exception):
    """The pod failed before the turn produced anything: another pod may run it."""


@dataclass
class TurnMeter:
    """Token counts of one turn as they accrue."""

    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    started: bool = False
    reason: common_pb2.FinishReason.ValueType = common_pb2.FINISH_REASON_UNSPECIFIED
    # The reply as streamed, for the zone store.
    text_parts: list[str] = field(default_factory=list)

    def usage(self) -> common_pb2.TokenUsage:
        return common_pb2.TokenUsage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cached_input_tokens=self.cached_input_tokens,
        )


def _now() -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.GetCurrentTime()
    return ts


class ChatGateway:
    """Authenticates, validates, places and meters chat turns."""

    def __init__(
        self,
        settings: RegionSettings,
        policy: PolicyCache,
        models: ModelResolver,
        pool: EnginePool,
        store: ZoneStore,
        shipper: UsageShipper,
        now: Callable[[], timestamp_pb2.Timestamp] = _now,
    ) -> None:
        self._settings = settings
        self._policy = policy
        self._models = models
        self._pool = pool
        self._store = store
        self._shipper = shipper
        self._now = now
        # Turn records being written; a drain waits for them.
        self._recording: set[asyncio.Task[None]] = set()

    async def run_turn(
        self, start: chat_service_pb2.ChatStart, secret: str | None, cancel: asyncio.Event
    ) -> AsyncIterator[chat_service_pb2.ChatResponse]:
        """Stream the events of one turn.

        Errors before the first event are raised as MeshError; later ones end
        the stream with an ``error`` event. Whatever ran is metered once, also
        when the caller goes away (the generator is closed or cancelled).
        """
        caller = self._policy.authenticate(secret)
        validate_start(start, self._settings.max_messages, self._settings.max_message_chars)
        model = await self._models.resolve(start.model, caller.tier)
        require_allowed(model, list(caller.tenant.allowed_models))
        request_id = start.request_id or new_id("req")
        meter = TurnMeter()
        tried: set[str] = set()
        try:
            while True:
                pod = self._pool.pick(model.name, frozenset(tried))
                try:
                    async for event in self._run_on_pod(pod, start, caller, model, request_id, meter, cancel):
                        yield event
                    return
                except _PodFailedEarly:
                    tried.add(pod.address)
                    self._pool.mark_failed(pod)
                    log.warning(
                        "turn %s: pod %s failed before output; trying another", request_id, pod.pod_id
                    )
        except asyncio.CancelledError:
            meter.reason = common_pb2.FINISH_REASON_CANCELLED
            raise
        finally:
            if meter.started:
                # Its own task: a client that goes away cancels this
                # generator, never the write of what it was billed for.
                record = asyncio.create_task(self._record_turn(caller, model, request_id, meter))
                self._recording.add(record)
                record.add_done_callback(self._recording.discard)

    async def _run_on_pod(
        self,
        pod: EnginePodHandle,
        start: chat_service_pb2.ChatStart,
        caller: Caller,
        model: model_registry_service_pb2.Model,
        request_id: str,
        meter: TurnMeter,
        cancel: asyncio.Event,
    ) -> AsyncIterator[chat_service_pb2.ChatResponse]:
        base_sequence = start.continuation.last_sequence if start.HasField("continuation") else 0
        call = pod.stub.Generate()
        pod.in_flight += 1
        forward = asyncio.create_task(self._forward_cancel(call, cancel, request_id))
        produced = False
        try:
            await call.write(
                engine_service_pb2.GenerateRequest(
                    start=engine_service_pb2.GenerateStart(
                        request_id=request_id,
                        model=model.name,
                        messages=start.messages,
                        sampling=start.sampling,
                        priority=engine_priority(caller.tier),
                        resume_output_token_ids=start.continuation.emitted_token_ids,
                    )
                )
            )
            async for resp in call:
                kind = resp.WhichOneof("event")
                if kind == "started":
                    produced = meter.started = True
                    meter.input_tokens = resp.started.prompt_tokens
                    meter.cached_input_tokens = resp.started.cached_prompt_tokens
                    yield chat_service_pb2.ChatResponse(
                        started=chat_service_pb2.ChatStarted(
                            request_id=request_id,
                            region=self._settings.region,
                            zone=self._settings.zone,
                            pod_id=resp.started.pod_id or pod.pod_id,
                            model=model.name,
                            create_time=self._now(),
                        )
                    )
                elif kind == "delta":
                    meter.output_tokens += len(resp.delta.token_ids)
                    meter.text_parts.append(resp.delta.text)
                    yield chat_service_pb2.ChatResponse(
                        delta=chat_service_pb2.ChatDelta(
                            sequence=base_sequence + resp.delta.sequence,
                            text=resp.delta.text,
                            token_ids=resp.delta.token_ids,
                        )
                    )
                elif kind == "finished":
                    finished = resp.finished
                    meter.reason = finished.reason
                    if finished.HasField("usage"):
                        meter.input_tokens = finished.usage.input_tokens or meter.input_tokens
                        meter.output_tokens = finished.usage.output_tokens
                        meter.cached_input_tokens = finished.usage.cached_input_tokens
                    cost = turn_cost(model, meter.input_tokens, meter.output_tokens)
                    yield chat_service_pb2.ChatResponse(
                        usage=chat_service_pb2.ChatUsage(usage=meter.usage(), cost_usd=format_usd(cost))
                    )
                    yield chat_service_pb2.ChatResponse(
                        finished=chat_service_pb2.ChatFinished(reason=finished.reason)
                    )
                    return
            raise Unavailable(Reason.ENGINE_FAILED, "the engine stream ended without a finish event")
        except grpc.aio.AioRpcError as err:
            if not produced and err.code() in _RETRYABLE_BEFORE_OUTPUT and not cancel.is_set():
                raise _PodFailedEarly from err
            error = from_rpc_error(err)
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                error = Unavailable(
                    Reason.ENGINE_FAILED,
                    f"engine pod {pod.pod_id} failed mid-stream: {err.details()}",
                    retry_after_s=1.0,
                )
            if not produced:
                raise error from err
            meter.reason = common_pb2.FINISH_REASON_ERROR
            yield chat_service_pb2.ChatResponse(error=error.to_stream_error())
        except MeshError as error:
            if not produced:
                raise
            meter.reason = common_pb2.FINISH_REASON_ERROR
            yield chat_service_pb2.ChatResponse(error=error.to_stream_error())
        finally:
            pod.in_flight -= 1
            await cancel_and_wait(forward)
            if not call.done():
                call.cancel()

    @staticmethod
    async def _forward_cancel(
        call: grpc.aio.StreamStreamCall[
            engine_service_pb2.GenerateRequest, engine_service_pb2.GenerateResponse
        ],
        cancel: asyncio.Event,
        request_id: str,
    ) -> None:
        await cancel.wait()
        with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError):
            await call.write(
                engine_service_pb2.GenerateRequest(
                    cancel=engine_service_pb2.GenerateCancel(request_id=request_id, reason="client cancelled")
                )
            )

    async def drain(self) -> None:
        """Wait for the turn records still being written."""
        if self._recording:
            await asyncio.gather(*self._recording, return_exceptions=True)

    async def _record_turn(
        self, caller: Caller, model: model_registry_service_pb2.Model, request_id: str, meter: TurnMeter
    ) -> None:
        """Write the reply and its usage row in one zone-store transaction;
        the shipper then delivers the usage to billing."""
        reason = meter.reason or common_pb2.FINISH_REASON_CANCELLED
        usage = billing_service_pb2.UsageRecord(
            request_id=request_id,
            tenant_id=caller.tenant_id,
            model=model.name,
            region=self._settings.region,
            usage=meter.usage(),
            finish_reason=reason,
            end_time=self._now(),
        )
        assistant = AssistantMessage(
            content="".join(meter.text_parts),
            model=model.name,
            finish_reason=common_pb2.FinishReason.Name(reason),
            input_tokens=meter.input_tokens,
            output_tokens=meter.output_tokens,
            cached_input_tokens=meter.cached_input_tokens,
            cost_usd=turn_cost(model, meter.input_tokens, meter.output_tokens),
        )
        try:
            await self._store.record_turn(
                caller.tenant_id, None, request_id, None, assistant, usage.SerializeToString()
            )
        except Exception:
            # The stream is over; all that is left is to say so loudly.
            log.exception("turn %s: its usage could not be recorded", request_id)
            return
        self._shipper.notify()
