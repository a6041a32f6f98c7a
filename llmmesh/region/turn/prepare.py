"""Preparing a turn, before it takes any capacity: authentication (the
cached policy snapshot), validation, the model (asked for, or ``auto`` by
difficulty, with fallbacks), the input safety filter, retrieval excerpts
and remembered facts, and the prompt fitted into the model's window in the
engine's tokens."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from llmmesh.core.errors import Reason, Unavailable
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.modelchoice.difficulty_route import ModelRouter
from llmmesh.region.modelchoice.model_policy import require_chat_model
from llmmesh.region.policy_cache import Caller, PolicyCache
from llmmesh.region.safety import SafetyFilters
from llmmesh.region.settings import RegionSettings
from llmmesh.region.turn.history import input_texts
from llmmesh.region.turn.knowledge import TurnKnowledge
from llmmesh.region.turn.prompt import TurnPrompts
from llmmesh.region.turn.request import ReadyTurn, TurnRequest, require_continuation_allowed
from llmmesh.region.turn.state import PreparedTurn
from llmmesh.region.turn.validation import validate_start
from llmmesh.v1 import chat_service_pb2, common_pb2, model_registry_service_pb2


class TurnPreparation:
    """The prepare stage. ``embedding_models`` names the models the
    region's pods embed with, so a turn on one is refused."""

    def __init__(
        self,
        settings: RegionSettings,
        policy: PolicyCache,
        model_router: ModelRouter,
        pool: EnginePool,
        safety: SafetyFilters | None,
        knowledge: TurnKnowledge,
        prompts: TurnPrompts,
        embedding_models: Callable[[], Collection[str]] = tuple,
    ) -> None:
        self._settings = settings
        self._policy = policy
        self.model_router = model_router
        self._pool = pool
        self._safety = safety
        self.knowledge = knowledge
        self.prompts = prompts
        self._embedding_models = embedding_models

    async def prepare(self, request: TurnRequest) -> ReadyTurn:
        """The turn ready for admission; errors (unauthenticated, invalid,
        flagged, no pod for any model it may run on) are raised as
        MeshError before any capacity is taken."""
        start = request.start
        caller = await self._policy.authenticate_fresh(request.secret)
        validate_start(start, self._settings.max_messages, self._settings.max_message_chars)
        require_continuation_allowed(start, request.allow_continuation)
        model, route = await self.model_router.choose(start, caller)
        require_chat_model(model, self._pool.models, self._embedding_models())
        screen = None
        request.hops.stamp("prepare")
        if self._safety is not None:
            await self._safety.input_filter.check(input_texts(start))
            request.hops.stamp("safety_input")
            # Retrieved text enters the prompt after the check above: it is screened on its own.
            screen = self._safety.input_filter.screen_excerpts
        lead, retrieval = await self.knowledge.gather(start, caller, request.secret, screen)
        prepared = await self._on_a_live_model(caller, model, start, route, lead)
        request.hops.stamp("prompt")
        return ReadyTurn(request, caller, route, lead, retrieval, prepared)

    async def _on_a_live_model(
        self,
        caller: Caller,
        model: model_registry_service_pb2.Model,
        start: chat_service_pb2.ChatStart,
        route: chat_service_pb2.RouteDecision,
        lead: Sequence[common_pb2.ChatMessage],
    ) -> PreparedTurn:
        """:meth:`TurnPrompts.prepare`; when no pod of ``model`` is left to
        tokenize the prompt (pods dead since the last health check, the
        model's tokenizer not yet known here), on the model
        :meth:`ModelRouter.after_failure` gives a turn that may fall back."""
        failed: set[str] = set()
        while True:
            try:
                # Refused before admission: with no pod, a queued turn would wait for nothing.
                no_pod = self._pool.no_pod_for(model.name)
                if no_pod is not None:
                    raise no_pod
                return await self.prompts.prepare(caller, model, start, lead)
            except Unavailable as error:
                if error.reason != Reason.ENGINE_UNAVAILABLE:
                    raise
                other = await self.model_router.after_failure(start, caller, model, failed, route)
                failed.add(model.name)
                if other is None:
                    raise
                model = other
