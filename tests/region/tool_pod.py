"""A simulator pod whose replies to a turn with tools are one tool call, for
the region's tool-call tests.

The simulator makes calls of its own only where guided (a named or
required tool choice), their length set by the function's schema
(tests.region.test_sim_tool_calls runs those); this makes a call of any
reply, of any length, so the region's part
of the contract (cancelling, filtering, continuing a long call) can be
tested on its own, in the form the contract fixes for pods: the simulator
generates the tokens as ever (timing, cancellation, resumption after
failover, its KV cache), and each delta's text becomes the next piece of
call 0's arguments, ``{"note": "<the text, JSON-escaped>"}``, exactly as the
contract says a pod streams a call: the first part has the pod's own id and
the function's name, later parts more arguments, the closing ``"}`` with the
last delta, and the reply finishes with TOOL_CALLS. A resumed generation
(a continuation) re-derives that the call is open from its resumed tokens
and does not open it again. With ``logprobs`` each token gets an entry (its
id, a fixed log probability) so tests can count them. Deltas in which the
simulator made tool calls itself pass as they are.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncGenerator

from llmmesh.engine.backend import (
    FinishReason,
    GeneratedTokens,
    GenerationEvent,
    GenerationFinished,
    GenerationRequest,
    TokenLogprobs,
    ToolCallPart,
)
from llmmesh.engine.sim.backend import SimBackend

POD_CALL_ID = "pod-call-0"
OPENING = '{"note": "'
CLOSING = '"}'
LOGPROB = -0.25


def make_tool_calling(backend: SimBackend) -> None:
    """Make ``backend`` answer turns with tools by one call of their first tool."""
    real = backend.generate

    async def generate(request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        tools = request.sampling.tools
        if not tools:
            async for event in real(request):
                yield event
            return
        opened = bool(request.resume_output_token_ids)
        pending: GeneratedTokens | None = None
        async for event in real(request):
            if isinstance(event, GeneratedTokens) and event.tool_calls:
                yield event  # the simulator made the calls itself
            elif isinstance(event, GeneratedTokens):
                if pending is not None:
                    yield _as_call(pending, request, tools[0].name, opened=opened, closing=False)
                    opened = True
                pending = event
            elif isinstance(event, GenerationFinished):
                if pending is not None:
                    yield _as_call(pending, request, tools[0].name, opened=opened, closing=True)
                done = event.reason in (FinishReason.STOP, FinishReason.LENGTH)
                yield dataclasses.replace(event, reason=FinishReason.TOOL_CALLS) if done else event
            else:
                yield event

    backend.generate = generate  # type: ignore[method-assign]


def _as_call(
    event: GeneratedTokens, request: GenerationRequest, name: str, *, opened: bool, closing: bool
) -> GeneratedTokens:
    arguments = json.dumps(event.text)[1:-1] + (CLOSING if closing else "")
    part = (
        ToolCallPart(0, arguments=arguments)
        if opened
        else ToolCallPart(0, POD_CALL_ID, name, OPENING + arguments)
    )
    logprobs = (
        tuple(TokenLogprobs(token_id, f"<{token_id}>", LOGPROB, b"") for token_id in event.token_ids)
        if request.sampling.logprobs
        else ()
    )
    return dataclasses.replace(event, text="", tool_calls=(part,), logprobs=logprobs)
