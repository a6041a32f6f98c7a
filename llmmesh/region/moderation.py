"""The region's moderation API (``ModerationService.Moderate``), answered
by the safety backends that filter the region's chat turns.

Each input is classified as a chat turn's input is (``kind="input"``), by
every configured backend in order (the rules backend, the LLM judge), and
the categories any of them found, blocking or report-only, are the
result's. Categories are OpenAI's names; the mesh's two extension
categories (``pii``, ``prompt_injection``) are not moderation categories
and are left out. The backends decide rather than estimate, so a score is
1.0 for a category found and 0.0 otherwise. A backend that fails or times
out fails the request (UNAVAILABLE ``SAFETY_UNAVAILABLE``): a moderation
answer is never a guess. A region that runs no safety backend refuses
(FAILED_PRECONDITION) instead of calling everything clean.

Requests are authenticated and count against the key's request rate limit
(RPM, with no tokens reserved); they are not billed, as OpenAI's are not.
"""

from __future__ import annotations

import asyncio
import logging

from llmmesh.core.errors import FailedPrecondition, InvalidArgument, MeshError, NotFound, Reason, Unavailable
from llmmesh.core.ids import new_id
from llmmesh.region.admission.control import Admission
from llmmesh.region.admission.rate_limit_status import rate_limit_status
from llmmesh.region.grpc_caller import Context, caller_secret
from llmmesh.region.policy_cache import PolicyCache
from llmmesh.region.safety import OPENAI_CATEGORIES, SafetyFilters
from llmmesh.region.settings import RegionSettings
from llmmesh.v1 import moderation_service_pb2 as pb
from llmmesh.v1 import moderation_service_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

MODERATION_SERVICE_NAME = "llmmesh.v1.ModerationService"

MODERATION_MODEL = "llmmesh-moderation"
"""The model name the region answers to: its own safety backends."""

LATEST_ALIASES = frozenset({"omni-moderation-latest", "text-moderation-latest", "text-moderation-stable"})
"""OpenAI's names for "the provider's current moderation model": the region's
backends are that here, and the answer names them (``llmmesh-moderation``).
A dated model (``omni-moderation-2024-09-26``) is refused: it names one
classifier that no region runs."""

MAX_INPUTS = 256
"""Most texts in one request."""


class ModerationGateway:
    """Authenticates, rate-limits and classifies moderation requests."""

    def __init__(
        self,
        settings: RegionSettings,
        policy: PolicyCache,
        admission: Admission,
        safety: SafetyFilters | None,
    ) -> None:
        self._settings = settings
        self._policy = policy
        self._admission = admission
        self._safety = safety

    async def moderate(
        self, request: pb.ModerateRequest, secret: str | None, deadline_s: float | None = None
    ) -> pb.ModerateResponse:
        """One result per input, in order; raises MeshError."""
        caller = await self._policy.authenticate_fresh(secret)
        if request.model not in ("", MODERATION_MODEL, *LATEST_ALIASES):
            raise NotFound(
                Reason.UNKNOWN_MODEL,
                f"moderation model {request.model!r} is not served here; use {MODERATION_MODEL!r} "
                "(the region's safety backends), a '-latest' alias of it, or leave model out",
                metadata={"param": "model"},
            )
        self._validate(request)
        safety = self._safety
        if safety is None:
            raise FailedPrecondition(
                Reason.NOT_IMPLEMENTED,
                f"region {self._settings.region} runs no safety backend to moderate with",
                metadata={"param": "input"},
            )
        admitted = await self._admission.admit(caller, 0, deadline_s, slot=False)
        try:
            results = [await self._classify(safety, text) for text in request.inputs]
        finally:
            admitted.release_slot()
            await admitted.settle(0)
            admitted.release_quota()
        return pb.ModerateResponse(
            request_id=request.request_id or new_id("modr"),
            model=MODERATION_MODEL,
            results=results,
            region=self._settings.region,
            rate_limit=rate_limit_status(admitted.reservation),
            backends=[b.name for b in safety.backends],
        )

    def _validate(self, request: pb.ModerateRequest) -> None:
        if not request.inputs:
            raise InvalidArgument(
                Reason.EMPTY_PROMPT, "input must hold at least one text", metadata={"param": "input"}
            )
        if len(request.inputs) > MAX_INPUTS:
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                f"input holds {len(request.inputs)} texts; at most {MAX_INPUTS} per request",
                metadata={"param": "input"},
            )
        for index, text in enumerate(request.inputs):
            if len(text) > self._settings.max_message_chars:
                raise InvalidArgument(
                    Reason.PROMPT_TOO_LONG,
                    f"input[{index}] has more than {self._settings.max_message_chars} characters",
                    metadata={"param": "input"},
                )

    @staticmethod
    async def _classify(safety: SafetyFilters, text: str) -> pb.ModerationResult:
        found: set[str] = set()
        for backend in safety.backends:
            try:
                async with asyncio.timeout(safety.timeout_s):
                    verdict = await backend.check(text, kind="input")
            except Exception as exc:
                log.warning("safety backend %s failed on a moderation input: %r", backend.name, exc)
                raise Unavailable(
                    Reason.SAFETY_UNAVAILABLE,
                    f"the safety check ({backend.name}) is unavailable: {type(exc).__name__}",
                    metadata={"backend": backend.name},
                    retry_after_s=safety.retry_after_s,
                ) from exc
            found.update(verdict.categories)
            found.update(verdict.reported)
        categories = [
            pb.ModerationCategory(name=name, flagged=name in found, score=1.0 if name in found else 0.0)
            for name in OPENAI_CATEGORIES
        ]
        return pb.ModerationResult(flagged=any(c.flagged for c in categories), categories=categories)


class ModerationServicer(pb_grpc.ModerationServiceServicer):
    """A thin gRPC face over :class:`ModerationGateway`."""

    def __init__(self, gateway: ModerationGateway) -> None:
        self._gateway = gateway

    async def Moderate(self, request: pb.ModerateRequest, context: Context) -> pb.ModerateResponse:
        try:
            return await self._gateway.moderate(request, caller_secret(context), context.time_remaining())
        except MeshError as err:
            await err.abort(context)
