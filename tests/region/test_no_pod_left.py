"""A region whose model has no engine pod left fails turns fast, also once its tokenizer is known."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tests.region.support import every_slot_held
from tests.region.test_chat_servicer import run_turn, start, turn_error
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.asyncio

# An upper bound so a regression fails the test instead of hanging it (not a timing assert).
_BOUND_S = 30.0


async def test_a_turn_after_every_pod_went_down_is_unavailable_once_the_tokenizer_is_known(
    stack: Stack,
) -> None:
    served = await run_turn(stack, start(max_tokens=4))
    assert served[-1].HasField("finished")
    await stack.engine.stop(0)
    await wait_until(lambda: not stack.region.pool.healthy_pods, what="engine marked down")
    async with asyncio.timeout(_BOUND_S):
        error = await turn_error(stack, start())
    assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, "ENGINE_UNAVAILABLE")
    assert error.retry_after_s is not None and error.retry_after_s > 0
    assert stack.region.gateway.admission.queue.stats().total_waiting == 0


async def test_a_turn_queued_when_the_last_pod_dies_is_released_unavailable(stack: Stack) -> None:
    served = await run_turn(stack, start(max_tokens=4))
    assert served[-1].HasField("finished")
    queue = stack.region.gateway.admission.queue
    # Every slot taken, so the next turn waits in the queue.
    async with every_slot_held(queue):
        waiting = asyncio.create_task(turn_error(stack, start()))
        await wait_until(lambda: queue.stats().total_waiting == 1, what="the turn queued")
        await stack.engine.stop(0)
        async with asyncio.timeout(_BOUND_S):
            error = await waiting
        assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, "ENGINE_UNAVAILABLE")
        assert error.retry_after_s is not None and error.retry_after_s > 0
        assert queue.stats().total_waiting == 0
