"""The sampling a region decides for a turn (:mod:`region.turn.sampling`):
a regeneration without a temperature is sampled at OpenAI's default, a
sampled turn without a seed gets one from its request id, so two turns draw
apart while a failover continuation resumes exactly, in a real in-process
region on the simulator."""

from __future__ import annotations

import pytest

from llmmesh.region.turn.sampling import REGENERATE_TEMPERATURE, fresh_draw, turn_seed
from llmmesh.v1 import chat_service_pb2, common_pb2
from tests.region.test_continuation import (
    USER,
    USER_TEXT,
    deltas,
    new_tenant,
    run,
    stack,  # noqa: F401 (the fixture)
)
from tests.stack import Stack

SAMPLED = common_pb2.SamplingParams(max_tokens=40, temperature=1.0)


def test_a_regeneration_without_temperature_is_sampled_with_the_turns_seed() -> None:
    start = chat_service_pb2.ChatStart(regenerate_message_id="msg_1", conversation_id="c")
    fresh_draw(start, "req-1")
    assert start.sampling.temperature == REGENERATE_TEMPERATURE
    assert start.sampling.seed == turn_seed("req-1") != turn_seed("req-2")


def test_the_caller_decides_where_it_said_and_greedy_turns_stay_greedy() -> None:
    chosen = chat_service_pb2.ChatStart(
        regenerate_message_id="msg_1", sampling=common_pb2.SamplingParams(temperature=0.0, seed=7)
    )
    fresh_draw(chosen, "req-1")
    assert (chosen.sampling.temperature, chosen.sampling.seed) == (0.0, 7)
    plain = chat_service_pb2.ChatStart()
    fresh_draw(plain, "req-1")
    assert not plain.sampling.HasField("temperature") and not plain.sampling.HasField("seed")


def test_a_continuation_draws_with_its_original_turns_seed() -> None:
    start = chat_service_pb2.ChatStart(
        sampling=common_pb2.SamplingParams(temperature=0.7),
        continuation=chat_service_pb2.Continuation(original_request_id="req-1"),
    )
    fresh_draw(start, "req-1-r2")
    assert start.sampling.seed == turn_seed("req-1")
    assert 0 <= turn_seed("") < 2**31


def _start(
    request_id: str, continuation: chat_service_pb2.Continuation | None = None
) -> chat_service_pb2.ChatStart:
    message = chat_service_pb2.ChatStart(
        request_id=request_id,
        model="auto",
        messages=[common_pb2.ChatMessage(role=USER, content=USER_TEXT)],
        sampling=SAMPLED,
    )
    if continuation is not None:
        message.continuation.CopyFrom(continuation)
    return message


@pytest.mark.asyncio
async def test_seedless_sampled_turns_draw_apart_and_a_continuation_resumes_exactly(stack: Stack) -> None:  # noqa: F811
    _, first = await new_tenant(stack)
    _, second = await new_tenant(stack)
    address = stack.region.address
    whole = "".join(d.text for d in deltas(await run(address, first, _start("req-s"))))
    other = "".join(d.text for d in deltas(await run(address, first, _start("req-t"))))
    assert whole and other and whole != other
    # Another tenant's turn of the same id is cut after two deltas and continued.
    delivered = deltas(await run(address, second, _start("req-s"), cancel_after=2))[:2]
    await stack.region.gateway.drain()
    continuation = chat_service_pb2.Continuation(
        original_request_id="req-s",
        original_region="us-west",
        emitted_token_ids=[t for d in delivered for t in d.token_ids],
        emitted_text="".join(d.text for d in delivered),
        last_sequence=delivered[-1].sequence,
    )
    rest = deltas(await run(address, second, _start("req-s-r2", continuation)))
    assert continuation.emitted_text + "".join(d.text for d in rest) == whole
