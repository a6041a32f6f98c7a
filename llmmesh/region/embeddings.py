"""The region's embeddings API (``RegionEmbeddingService.CreateEmbeddings``):
a batch from an authenticated caller to the pod that embeds with its model,
metered and billed like a chat turn.

A request goes through, in order: authentication (the cached policy
snapshot), validation, model resolution and the tenant's allowed models,
admission (the key's RPM and TPM limits and the tenant's monthly quota,
but no slot of the chat pods' fair queue, which embedding pods do not
fill: reserved for an upper bound of the inputs' tokens, since a token
is at least one byte, then settled to the tokens the pod counted), the
least-busy pod embedding with the model (the next one if a pod is
unreachable), and the usage record: input tokens only, priced at the
model's input price, written to the zone store in one transaction and
shipped to billing as a chat turn's is. A request id the tenant used
before is refused (ALREADY_EXISTS) before the vectors are returned, so
an id cannot be replayed for unbilled vectors. Token-id inputs need the
``x-llmmesh-token-ids`` metadata naming the model (:mod:`core.embedding_tokens`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from decimal import Decimal

import grpc
import grpc.aio
from google.protobuf import timestamp_pb2

from llmmesh.core.embedding_tokens import TOKEN_IDS_HEADER, token_ids_refusal
from llmmesh.core.end_user import require_end_user
from llmmesh.core.errors import AlreadyExists, InvalidArgument, MeshError, Reason, Unavailable, from_rpc_error
from llmmesh.core.ids import new_id
from llmmesh.core.model_resolver import ModelResolver
from llmmesh.core.pricing import format_usd
from llmmesh.region.admission.control import Admission
from llmmesh.region.admission.rate_limit_status import rate_limit_status
from llmmesh.region.embedding_pods import EmbeddingPod, EmbeddingPods
from llmmesh.region.grpc_caller import Context, caller_secret
from llmmesh.region.modelchoice.model_policy import require_allowed, turn_cost
from llmmesh.region.policy_cache import Caller, PolicyCache
from llmmesh.region.settings import RegionSettings
from llmmesh.region.usage_shipper import UsageShipper
from llmmesh.region.zone_store.rows import AssistantMessage
from llmmesh.region.zone_store.store import ZoneStore
from llmmesh.v1 import billing_service_pb2, common_pb2, embedding_service_pb2, embedding_service_pb2_grpc

log = logging.getLogger(__name__)

EMBEDDINGS_SERVICE_NAME = "llmmesh.v1.RegionEmbeddingService"

MAX_INPUTS = 2048
"""Most inputs in one request, OpenAI's limit."""
# Special tokens a model may add around an input, counted in the reservation.
_SPECIAL_TOKEN_ALLOWANCE = 2
_EMBED_TIMEOUT_S = 60.0


def _now() -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.GetCurrentTime()
    return ts


def token_bound(item: embedding_service_pb2.EmbeddingInput) -> int:
    """The most tokens ``item`` can take: its ids, or one per UTF-8 byte of
    its text (no tokenizer the mesh uses makes a token of less) plus the
    special tokens a model may add."""
    if item.WhichOneof("input") == "tokens":
        return len(item.tokens.ids)
    return len(item.text.encode("utf-8")) + _SPECIAL_TOKEN_ALLOWANCE


def validate_embeddings(request: embedding_service_pb2.CreateEmbeddingsRequest, max_chars: int) -> None:
    """INVALID_ARGUMENT naming the param for a request no pod could serve."""
    if not request.model:
        raise InvalidArgument(Reason.UNKNOWN_MODEL, "model is required", metadata={"param": "model"})
    if not request.inputs:
        raise InvalidArgument(
            Reason.EMPTY_PROMPT, "input must hold at least one item", metadata={"param": "input"}
        )
    if len(request.inputs) > MAX_INPUTS:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"input holds {len(request.inputs)} items; at most {MAX_INPUTS} per request",
            metadata={"param": "input"},
        )
    for index, item in enumerate(request.inputs):
        kind = item.WhichOneof("input")
        if kind is None or (kind == "text" and not item.text) or (kind == "tokens" and not item.tokens.ids):
            raise InvalidArgument(
                Reason.EMPTY_PROMPT, f"input[{index}] is empty", metadata={"param": "input"}
            )
        if kind == "text" and len(item.text) > max_chars:
            raise InvalidArgument(
                Reason.PROMPT_TOO_LONG,
                f"input[{index}] has more than {max_chars} characters",
                metadata={"param": "input"},
            )
    if request.HasField("dimensions") and request.dimensions < 1:
        raise InvalidArgument(
            Reason.INVALID_REQUEST, "dimensions must be at least 1", metadata={"param": "dimensions"}
        )
    # Logged and billed with the request: refused here if it could not be.
    require_end_user(request.user)


class EmbeddingsGateway:
    """Authenticates, admits, places and bills embedding requests."""

    def __init__(
        self,
        settings: RegionSettings,
        policy: PolicyCache,
        models: ModelResolver,
        pods: EmbeddingPods,
        admission: Admission,
        store: ZoneStore,
        shipper: UsageShipper,
        now: Callable[[], timestamp_pb2.Timestamp] = _now,
    ) -> None:
        self._settings = settings
        self._policy = policy
        self._models = models
        self._pods = pods
        self._admission = admission
        self._store = store
        self._shipper = shipper
        self._now = now

    async def create(
        self,
        request: embedding_service_pb2.CreateEmbeddingsRequest,
        secret: str | None,
        deadline_s: float | None = None,
        token_ids_of: str | None = None,
    ) -> embedding_service_pb2.CreateEmbeddingsResponse:
        """The vectors of ``request`` for the caller behind ``secret``;
        ``token_ids_of`` is the model the caller declared its token ids are
        of (``x-llmmesh-token-ids``). Raises MeshError. Usage is recorded
        before the answer returns."""
        caller = await self._policy.authenticate_fresh(secret)
        validate_embeddings(request, self._settings.max_message_chars)
        try:
            model = await self._models.resolve(request.model, caller.tier)
        except MeshError as err:
            # The registry's refusal is about the request's model field.
            err.metadata.setdefault("param", "model")
            raise
        require_allowed(model, list(caller.tenant.allowed_models))
        has_token_ids = any(item.WhichOneof("input") == "tokens" for item in request.inputs)
        refusal = token_ids_refusal((request.model, model.name), token_ids_of, has_token_ids)
        if refusal is not None:
            param = "input" if token_ids_of is None else TOKEN_IDS_HEADER
            raise InvalidArgument(Reason.INVALID_REQUEST, refusal, metadata={"param": param})
        # Refused before admission when no pod here embeds with it.
        await self._pods.place(model.name)
        request_id = request.request_id or new_id("emb")
        bound = sum(token_bound(item) for item in request.inputs)
        admitted = await self._admission.admit(caller, bound, deadline_s, slot=False)
        used = 0
        try:
            embedded = await self._embed(model.name, request, request_id)
            used = sum(e.input_tokens for e in embedded.embeddings)
            cost = turn_cost(model, used, 0)
            await self._record(caller, request_id, model.name, used, cost, request.user)
            # The end user, as OpenAI's `user` asks, for abuse tracking in the region's log.
            log.info(
                "embeddings %s: tenant %s, user %r, %d inputs, %d tokens",
                request_id,
                caller.tenant_id,
                request.user,
                len(request.inputs),
                used,
            )
        finally:
            admitted.release_slot()
            await admitted.settle(used)
            admitted.release_quota()
        return embedding_service_pb2.CreateEmbeddingsResponse(
            request_id=request_id,
            model=model.name,
            embeddings=embedded.embeddings,
            usage=common_pb2.TokenUsage(input_tokens=used),
            cost_usd=format_usd(cost),
            region=self._settings.region,
            zone=self._settings.zone,
            rate_limit=rate_limit_status(admitted.reservation),
        )

    async def _embed(
        self, model: str, request: embedding_service_pb2.CreateEmbeddingsRequest, request_id: str
    ) -> embedding_service_pb2.EmbedResponse:
        """Embed on the least-busy pod; an unreachable pod is marked failed
        and the next one tried."""
        tried: set[str] = set()
        message = embedding_service_pb2.EmbedRequest(
            request_id=request_id, model=model, inputs=request.inputs
        )
        if request.HasField("dimensions"):
            message.dimensions = request.dimensions
        while True:
            target = await self._pods.place(model, frozenset(tried))
            try:
                return await self._on_pod(target, message)
            except MeshError as err:
                if err.code != grpc.StatusCode.UNAVAILABLE:
                    raise
                tried.add(target.pod.address)
                self._pods.mark_failed(target)
                log.warning(
                    "embeddings %s: pod %s unavailable; trying another", request_id, target.pod.pod_id
                )

    @staticmethod
    async def _on_pod(
        target: EmbeddingPod, message: embedding_service_pb2.EmbedRequest
    ) -> embedding_service_pb2.EmbedResponse:
        target.in_flight += 1
        try:
            response: embedding_service_pb2.EmbedResponse = await target.stub.Embed(
                message, timeout=_EMBED_TIMEOUT_S
            )
            return response
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err) from err
        finally:
            target.in_flight -= 1

    async def _record(
        self, caller: Caller, request_id: str, model: str, used: int, cost: Decimal, end_user: str
    ) -> None:
        """The usage row in the zone store (no content is stored), then billing."""
        usage = billing_service_pb2.UsageRecord(
            request_id=request_id,
            tenant_id=caller.tenant_id,
            model=model,
            region=self._settings.region,
            usage=common_pb2.TokenUsage(input_tokens=used),
            finish_reason=common_pb2.FINISH_REASON_STOP,
            end_time=self._now(),
            end_user=end_user,
        ).SerializeToString()
        summary = AssistantMessage(
            content="", model=model, finish_reason="FINISH_REASON_STOP", input_tokens=used, cost_usd=cost
        )
        try:
            record = await self._store.record_turn(
                caller.tenant_id, None, request_id, None, summary, usage, tokens=used
            )
        except MeshError:
            raise
        except Exception as err:
            log.exception("embeddings %s: usage could not be recorded", request_id)
            raise Unavailable(
                Reason.REGION_UNAVAILABLE, "the zone store cannot record usage now", retry_after_s=1.0
            ) from err
        if record.duplicate:
            raise AlreadyExists(
                Reason.DUPLICATE_REQUEST,
                f"request id {request_id!r} was used before",
                metadata={"request_id": request_id},
            )
        self._shipper.notify()


class RegionEmbeddingServicer(embedding_service_pb2_grpc.RegionEmbeddingServiceServicer):
    """A thin gRPC face over :class:`EmbeddingsGateway`."""

    def __init__(self, gateway: EmbeddingsGateway) -> None:
        self._gateway = gateway

    async def CreateEmbeddings(
        self, request: embedding_service_pb2.CreateEmbeddingsRequest, context: Context
    ) -> embedding_service_pb2.CreateEmbeddingsResponse:
        try:
            # Shielded: a caller that goes away must not cancel the usage write.
            return await asyncio.shield(
                self._gateway.create(
                    request, caller_secret(context), context.time_remaining(), _token_ids_of(context)
                )
            )
        except MeshError as err:
            await err.abort(context)


def _token_ids_of(context: Context) -> str | None:
    """The model the caller's ``x-llmmesh-token-ids`` metadata names, if any."""
    for key, value in context.invocation_metadata() or ():
        if key == TOKEN_IDS_HEADER and isinstance(value, str):
            return value
    return None
