"""Placing a turn again (:class:`region.turn.place.TurnPlacement`): a pod
that fails before the turn's first event gives way to another pod of the
model, which the router chooses with the failed one left out; with none
left, the router's refusal is the turn's. The router, the pool and the pod
streams are scripted, so the placement's own decisions are what is tested."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest

from llmmesh.core.errors import Reason, Unavailable
from llmmesh.region import metrics as region_metrics
from llmmesh.region.placement.router import RoutingPolicy
from llmmesh.region.turn.place import TurnPlacement
from llmmesh.region.turn.request import ReadyTurn
from llmmesh.region.turn.state import Turn, TurnMeter
from llmmesh.region.turn.stream import PodFailedEarly
from llmmesh.v1 import chat_service_pb2

pytestmark = pytest.mark.asyncio

MODEL = "placed-again-model"


class ScriptedRouter:
    """Chooses the first of ``pods`` not left out, as the real router
    chooses among healthy pods; UNAVAILABLE when every pod is left out."""

    def __init__(self, pods: Sequence[SimpleNamespace]) -> None:
        self.pods = pods
        self.excluded: list[set[str]] = []

    async def choose(self, model: str, token_ids: Sequence[int], exclude: Collection[str] = ()) -> Any:
        self.excluded.append(set(exclude))
        for pod in self.pods:
            if pod.address not in exclude:
                return SimpleNamespace(pod=pod, policy=RoutingPolicy.PRECISE, resident_tokens=0)
        raise Unavailable(Reason.ENGINE_UNAVAILABLE, f"no pod of {model} is left")


class ScriptedPods:
    """Pods in ``failing`` fail before any output; any other streams one delta."""

    def __init__(self, failing: set[str]) -> None:
        self.failing = failing
        self.ran: list[str] = []

    async def run(
        self, pod: Any, start: Any, turn: Any, cancel: Any
    ) -> AsyncIterator[chat_service_pb2.ChatResponse]:
        self.ran.append(pod.pod_id)
        if pod.pod_id in self.failing:
            raise PodFailedEarly
        yield chat_service_pb2.ChatResponse(delta=chat_service_pb2.ChatDelta(text=f"from {pod.pod_id}"))


class Pool:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def mark_failed(self, pod: Any) -> None:
        self.failed.append(pod.pod_id)


class NoFallback:
    """A model router with no other model to fall back to."""

    async def after_failure(self, *args: object) -> None:
        return None


def placement(
    pods: Sequence[SimpleNamespace], failing: set[str]
) -> tuple[TurnPlacement, ScriptedRouter, ScriptedPods, Pool]:
    router, streams, pool = ScriptedRouter(pods), ScriptedPods(failing), Pool()
    preparation = SimpleNamespace(model_router=NoFallback())
    place = TurnPlacement(
        cast(Any, router), cast(Any, pool), cast(Any, preparation), cast(Any, None), cast(Any, streams)
    )
    return place, router, streams, pool


def a_turn() -> tuple[ReadyTurn, Turn]:
    start = chat_service_pb2.ChatStart(request_id="turn-1", model=MODEL)
    ready = SimpleNamespace(request=SimpleNamespace(start=start, cancel=asyncio.Event()), route=None, lead=())
    prepared = SimpleNamespace(model=SimpleNamespace(name=MODEL), token_ids=(1, 2, 3), request_id="turn-1")
    turn = SimpleNamespace(prepared=prepared, meter=TurnMeter(), hops=None, caller=None)
    return cast(ReadyTurn, ready), cast(Turn, turn)


def pods(*names: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(pod_id=name, address=f"10.0.0.{i}:9000") for i, name in enumerate(names, 1)]


def placed_again() -> float:
    return float(region_metrics.TURNS_PLACED_AGAIN.labels(MODEL)._value.get())


async def test_a_pod_failing_before_output_gives_the_turn_to_the_models_other_pod() -> None:
    two = pods("pod-a", "pod-b")
    place, router, streams, pool = placement(two, failing={"pod-a"})
    before = placed_again()
    ready, turn = a_turn()
    events = [event async for event in place.stream(ready, turn)]
    assert [event.delta.text for event in events] == ["from pod-b"]
    assert streams.ran == ["pod-a", "pod-b"]
    assert router.excluded == [set(), {two[0].address}], "the second choice did not leave the failed pod out"
    assert pool.failed == ["pod-a"], "the failed pod stays in placement"
    assert placed_again() == before + 1


async def test_with_every_pod_of_the_model_failed_the_routers_refusal_is_the_turns() -> None:
    two = pods("pod-a", "pod-b")
    place, router, streams, pool = placement(two, failing={"pod-a", "pod-b"})
    ready, turn = a_turn()
    with pytest.raises(Unavailable) as refused:
        async for _ in place.stream(ready, turn):
            pass
    assert refused.value.reason == Reason.ENGINE_UNAVAILABLE
    assert streams.ran == ["pod-a", "pod-b"]
    assert router.excluded[-1] == {pod.address for pod in two}
    assert pool.failed == ["pod-a", "pod-b"]
