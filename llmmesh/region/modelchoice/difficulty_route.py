"""Which model serves a turn: the name asked for, or for ``auto`` the
cheapest model of the region expected to do the job, with fallbacks.

The candidates are the chat models the region's pods serve that the tenant
may use, as the registry resolves them (tier and prices). For ``auto`` the
:class:`~region.modelchoice.difficulty.DifficultyScorer` names the smallest tier
expected to do the job and the turn goes to the cheapest candidate of that
tier or above. A region serving fewer than two chat models keeps the
registry's answer (the tenant tier's default), as before there was a fleet,
or its one model when the default is not served here.

Fallback: a model whose pods here are all down, or all at least
``fallback_queue_factor`` times their batch size deep, is overloaded; a
turn that may fall back (every ``auto`` turn, and a named model's turn of
a tenant tier in ``named_fallback_tiers``) then goes to the nearest
candidate that is not: the cheapest larger one, else the largest smaller
one. Candidates are this region's, so a fallback never leaves the zone. A
turn with nowhere to go keeps its model and meets the usual refusal.

A model can also fail after the choice: every pod of it fails the turn
before its first event (down since the last health check, say). The gateway
then asks :meth:`ModelRouter.after_failure`, which applies the same rule to
the models not yet failed (one with room first, else one with a healthy pod
that may queue the turn), so a turn that may fall back is served by another
model of this region instead of a 503; a continuation keeps its model.

Canaries: a model handed out with canaries (the registry's
``Model.canaries``) gives each its percent of turns, chosen by a stable
hash of the request id, when the canary is deployed here.

The decision travels as a :class:`RouteDecision` (``ChatStarted.route``;
the edge's ``x-llmmesh-route-reason``) and is counted in
``llmmesh_region_route_decisions_total{model,reason}`` (a turn moved by
:meth:`ModelRouter.after_failure` counts once more, as ``fallback``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from prometheus_client import Counter

from llmmesh.core.errors import MeshError
from llmmesh.core.model_resolver import ModelResolver
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.metrics import REGISTRY
from llmmesh.region.modelchoice.difficulty import DifficultyScorer, RuleScorer, features_of
from llmmesh.region.modelchoice.difficulty_inputs import BudgetLeft, HistorySize, no_history
from llmmesh.region.modelchoice.model_policy import require_allowed
from llmmesh.region.placement.router import LoadBoard
from llmmesh.region.policy_cache import Caller
from llmmesh.v1 import chat_service_pb2, common_pb2, model_registry_service_pb2

log = logging.getLogger(__name__)

Model = model_registry_service_pb2.Model

AUTO_NAMES = ("", "auto")

REQUESTED, DEFAULT, DIFFICULTY, BUDGET, FALLBACK = "requested", "default", "difficulty", "budget", "fallback"
REASONS = (REQUESTED, DEFAULT, DIFFICULTY, BUDGET, FALLBACK)
"""Every reason a route decision can give (a bounded metric label)."""


ROUTE_DECISIONS = Counter(
    "llmmesh_region_route_decisions",
    "Turns by the model chosen to serve them and why: requested, default, difficulty, budget, fallback",
    ["model", "reason"],
    registry=REGISTRY,
)
"""``llmmesh_region_route_decisions_total{model,reason}``, on the region's ``/metrics``."""


@dataclass(frozen=True)
class FleetPolicy:
    """How the region picks among its models."""

    fallback_queue_factor: float = 2.0
    """A model is overloaded when every pod of it is this many batches deep (or down)."""
    named_fallback_tiers: frozenset[common_pb2.Tier.ValueType] = frozenset()
    """Tenant tiers whose turns on a named model may fall back too (``auto`` always may)."""

    def __post_init__(self) -> None:
        if not self.fallback_queue_factor > 0:
            raise ValueError(f"fallback_queue_factor must be positive, got {self.fallback_queue_factor}")

    @classmethod
    def of(cls, fallback_queue_factor: float, named_fallback_tiers: str) -> FleetPolicy:
        """The policy of the region's settings; ValueError naming an unknown tier."""
        known = {
            "free": common_pb2.TIER_FREE,
            "pro": common_pb2.TIER_PRO,
            "enterprise": common_pb2.TIER_ENTERPRISE,
        }
        tiers = set()
        for name in (t.strip().lower() for t in named_fallback_tiers.split(",") if t.strip()):
            if name not in known:
                raise ValueError(
                    f"named_fallback_tiers: unknown tier {name!r}; expected free, pro or enterprise"
                )
            tiers.add(known[name])
        return cls(fallback_queue_factor, frozenset(tiers))


def _price(model: Model) -> tuple[float, float]:
    return float(model.pricing.output_per_1k_usd or 0), float(model.pricing.input_per_1k_usd or 0)


def _by_cost(model: Model) -> tuple[int, tuple[float, float], str]:
    return int(model.tier), _price(model), model.name


class ModelRouter:
    """Chooses the model of each chat turn of one region."""

    def __init__(
        self,
        models: ModelResolver,
        pool: EnginePool,
        loads: LoadBoard,
        budget_left: BudgetLeft,
        *,
        embedding_models: Callable[[], Collection[str]] = tuple,
        scorer: DifficultyScorer | None = None,
        policy: FleetPolicy | None = None,
        history: HistorySize = no_history,
    ) -> None:
        self._models = models
        self._pool = pool
        self._loads = loads
        self._budget_left = budget_left
        self._embedding_models = embedding_models
        self.scorer: DifficultyScorer = scorer or RuleScorer()
        self.policy = policy or FleetPolicy()
        self._history = history

    async def choose(
        self, start: chat_service_pb2.ChatStart, caller: Caller
    ) -> tuple[Model, chat_service_pb2.RouteDecision]:
        """The model for ``start`` and why. Raises what resolving the
        requested name raises (unknown, not allowed, retired)."""
        requested = start.model or "auto"
        route = chat_service_pb2.RouteDecision(requested_model=requested)
        named = start.model not in AUTO_NAMES
        # A continuation goes on with the model its turn started on.
        if named or start.HasField("continuation"):
            model = await self._resolve_allowed(start.model, caller)
            route.reason, route.detail = REQUESTED, f"{model.name} as requested"
            candidates = await self._candidates(caller) if self._may_fall_back(caller) else []
        else:
            candidates = await self._candidates(caller)
            if len(candidates) < 2:
                model = await self._resolve_allowed(start.model, caller)
                route.reason, route.detail = DEFAULT, f"{model.name}: the {_tier_name(caller)} tier's default"
                if candidates and model.name not in self._pool.models:
                    # The tier's default is not served here; the region's one model is.
                    model = candidates[0]
                    route.detail = f"{model.name}: the region's one model"
            else:
                history = await self._history(caller, start)
                model = await self._by_difficulty(start, caller, candidates, history, route)
        if not start.HasField("continuation"):
            model = await self._fall_back(model, candidates, route)
            model = await self._canary(model, start.request_id, caller, route)
        ROUTE_DECISIONS.labels(model.name, route.reason).inc()
        return model, route

    async def _by_difficulty(
        self,
        start: chat_service_pb2.ChatStart,
        caller: Caller,
        candidates: Sequence[Model],
        history: tuple[int, int],
        route: chat_service_pb2.RouteDecision,
    ) -> Model:
        budget = await self._budget_left(caller)
        features = features_of(list(start.messages), caller.tier, budget, *history)
        difficulty = self.scorer.score(features)
        fitting = [m for m in candidates if m.tier >= difficulty.tier]
        model = min(fitting, key=_by_cost) if fitting else max(candidates, key=_by_cost)
        route.reason = BUDGET if difficulty.capped_by_budget else DIFFICULTY
        route.difficulty = difficulty.score
        signals = ", ".join(difficulty.signals) or "short and plain"
        route.detail = (
            f"difficulty {difficulty.score:.2f} ({signals}): "
            f"{model_registry_service_pb2.ModelTier.Name(difficulty.tier).removeprefix('MODEL_TIER_').lower()}"
            f" tier, {model.name}"
        )
        return model

    async def _fall_back(
        self, model: Model, candidates: Sequence[Model], route: chat_service_pb2.RouteDecision
    ) -> Model:
        if not self.overloaded(model.name):
            return model
        others = [m for m in candidates if m.name != model.name and not self.overloaded(m.name)]
        if not others:
            return model
        chosen = _nearest(model, others)
        log.info("model %s is overloaded or down here; turn falls back to %s", model.name, chosen.name)
        route.reason = FALLBACK
        route.detail = f"{model.name} overloaded or down in the region; {chosen.name} serves ({route.detail})"
        return chosen

    async def after_failure(
        self,
        start: chat_service_pb2.ChatStart,
        caller: Caller,
        failed: Model,
        tried: Collection[str],
        route: chat_service_pb2.RouteDecision,
    ) -> Model | None:
        """Another model of the region for a turn whose chosen ``failed``
        model lost every pod here before the turn's first event, or None
        when the turn may not fall back (a continuation; a named model of a
        tier the policy does not name) or no other model can take it.
        ``tried`` names the models that already failed this turn. Says so
        in ``route`` and counts the decision."""
        if start.HasField("continuation"):
            return None
        if start.model not in AUTO_NAMES and not self._may_fall_back(caller):
            return None
        excluded = {failed.name, *tried}
        others = [m for m in await self._candidates(caller) if m.name not in excluded]
        healthy = {p.model for p in self._pool.healthy_pods if p.pod_id}
        with_room = [m for m in others if not self.overloaded(m.name)]
        reachable = with_room or [m for m in others if m.name in healthy]
        if not reachable:
            return None
        chosen = _nearest(failed, reachable)
        log.warning("every pod of %s failed the turn here; it falls back to %s", failed.name, chosen.name)
        route.reason = FALLBACK
        route.detail = (
            f"{failed.name} failed on every pod in the region before output; {chosen.name} serves"
            f" ({route.detail})"
        )
        ROUTE_DECISIONS.labels(chosen.name, FALLBACK).inc()
        return chosen

    async def _canary(
        self, model: Model, request_id: str, caller: Caller, route: chat_service_pb2.RouteDecision
    ) -> Model:
        if not model.canaries:
            return model
        point = int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:4], "big") % 100
        edge = 0
        for canary in model.canaries:
            edge += canary.percent
            if point < edge:
                if canary.name not in self._pool.models or self.overloaded(canary.name):
                    return model
                try:
                    chosen = await self._resolve_allowed(canary.name, caller)
                except MeshError:
                    return model
                route.detail += f"; canary {chosen.name} ({canary.percent}% of {model.name})"
                return chosen
        return model

    def overloaded(self, model: str) -> bool:
        """Whether every pod of ``model`` here is down or ``fallback_queue_factor`` batches deep."""
        pods = [p for p in self._pool.healthy_pods if p.pod_id and p.model == model]
        factor = self.policy.fallback_queue_factor
        return all(self._loads.load_of(p).depth >= factor * max(p.info.max_num_seqs, 1) for p in pods)

    def _may_fall_back(self, caller: Caller) -> bool:
        return caller.tier in self.policy.named_fallback_tiers

    async def _candidates(self, caller: Caller) -> list[Model]:
        """The chat models of the region's pods the tenant may use."""
        embedding = set(self._embedding_models())
        found = []
        for name in self._pool.models:
            if name in embedding:
                continue
            try:
                model = await self._resolve_allowed(name, caller)
            except MeshError as err:
                log.debug("model %s is no candidate for tenant %s: %s", name, caller.tenant_id, err)
                continue
            if not model.canary_of:
                found.append(model)
        return found

    async def _resolve_allowed(self, name: str, caller: Caller) -> Model:
        model = await self._models.resolve(name, caller.tier)
        require_allowed(model, list(caller.tenant.allowed_models))
        return model


def _nearest(model: Model, others: Sequence[Model]) -> Model:
    """The cheapest of ``others`` larger than ``model``, else the largest smaller one."""
    larger = [m for m in others if _by_cost(m) > _by_cost(model)]
    return min(larger, key=_by_cost) if larger else max(others, key=_by_cost)


def _tier_name(caller: Caller) -> str:
    return common_pb2.Tier.Name(caller.tier).removeprefix("TIER_").lower()
