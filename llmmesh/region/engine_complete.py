"""One-shot completions on the region's own engine pods, for the LLM-judge
safety backend (at the engine's highest priority, so a busy region does not
starve its own safety checks; unbilled, the region's own work) and the
region's housekeeping (:mod:`region.lifecycle.housekeeping_model`, at the
lowest; metered with the tokens the pod counted and billed to the tenant it
ran for): greedy, optionally guided to a JSON schema."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
import grpc.aio

from llmmesh.core.errors import Reason, Unavailable, from_rpc_error
from llmmesh.core.ids import new_id
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.safety import CompleteFn
from llmmesh.v1 import common_pb2, engine_service_pb2

_ROLES = {
    "system": common_pb2.CHAT_ROLE_SYSTEM,
    "user": common_pb2.CHAT_ROLE_USER,
    "assistant": common_pb2.CHAT_ROLE_ASSISTANT,
}


@dataclass(frozen=True)
class Completion:
    """A one-shot completion's text and the tokens its pod processed for it."""

    text: str
    input_tokens: int
    output_tokens: int


Generate = Callable[[list[tuple[str, str]], int], Awaitable[Completion]]
"""A greedy completion of (role, text) messages with at most the given output tokens."""


def engine_completer(
    pool: EnginePool,
    model: str,
    timeout_s: float = 30.0,
    priority: int = 0,
    response_format: common_pb2.ResponseFormat | None = None,
) -> CompleteFn:
    """A :data:`region.safety.CompleteFn` that asks a healthy pod serving
    ``model`` (any model when empty), at engine ``priority`` (0, the highest,
    by default: the region's own checks come first), its reply guided by
    ``response_format`` when given."""
    generate = engine_generator(pool, model, timeout_s, priority, response_format)

    async def complete(turns: list[tuple[str, str]], max_tokens: int) -> str:
        return (await generate(turns, max_tokens)).text

    return complete


def engine_generator(
    pool: EnginePool,
    model: str,
    timeout_s: float = 30.0,
    priority: int = 0,
    response_format: common_pb2.ResponseFormat | None = None,
) -> Generate:
    """As :func:`engine_completer`, with the tokens the pod counted."""

    async def complete(turns: list[tuple[str, str]], max_tokens: int) -> Completion:
        messages = []
        for role, content in turns:
            if role not in _ROLES:
                raise ValueError(f"unknown role {role!r} in a judge prompt")
            messages.append(common_pb2.ChatMessage(role=_ROLES[role], content=content))
        pod = pool.pick(model)
        call = pod.stub.Generate(timeout=timeout_s)
        parts: list[str] = []
        pod.in_flight += 1
        try:
            await call.write(
                engine_service_pb2.GenerateRequest(
                    start=engine_service_pb2.GenerateStart(
                        request_id=new_id("judge"),
                        model=model or pod.model,
                        messages=messages,
                        sampling=common_pb2.SamplingParams(
                            max_tokens=max_tokens, temperature=0.0, response_format=response_format
                        ),
                        priority=priority,
                    )
                )
            )
            await call.done_writing()
            async for response in call:
                if response.HasField("delta"):
                    parts.append(response.delta.text)
                elif response.HasField("finished"):
                    usage = response.finished.usage
                    return Completion("".join(parts), usage.input_tokens, usage.output_tokens)
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err) from err
        finally:
            pod.in_flight -= 1
        raise Unavailable(Reason.ENGINE_FAILED, "the judge model's stream ended without a finish")

    return complete
