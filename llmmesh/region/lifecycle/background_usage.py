"""Background work billed to the tenant it runs for.

A conversation summary (:mod:`region.lifecycle.summaries`) or a memory
extraction (:mod:`region.knowledge.memory_model`) runs on the region's
pods for one tenant, so it is metered and billed like a turn, as a line
of its own: each generation's prompt and output tokens, as its pod counted
them, become a usage row of the tenant in the zone store (request id
``_summary_…`` or ``_memory_…``: a tenant's own ids begin with a letter or
digit, so none is taken from it), with the record's ``purpose`` set, which
the usage shipper sends to billing with the turns' rows.

Before a generation runs, its most tokens (one per UTF-8 byte of its prompt
plus an allowance for the chat template, plus its ``max_tokens``) must fit:

- the tenant's daily cap on background tokens (its policy's
  ``background_tokens_per_day``, else the region's setting; 0 none), against
  the background rows recorded in the zone since midnight UTC;
- its monthly quota, counted as for a turn (:class:`QuotaLedger`), whole:
  background work never takes the tenant past its quota;
- its TPM limit, in a window of the tenant's background work of its own
  (background work is no key's).

Work that does not fit is skipped (logged, and counted in
``llmmesh_region_background_skipped``): the summary or the facts are not
written, and nothing is billed. Checks and records of one tenant are
serialized in the region, so the cap holds however many run at once here;
regions of a zone racing may overrun it by one generation each.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from google.protobuf import timestamp_pb2
from prometheus_client import Counter

from llmmesh.core.errors import MeshError, Reason
from llmmesh.core.ids import new_id
from llmmesh.core.usage_purpose import purpose_proto
from llmmesh.region import metrics as region_metrics
from llmmesh.region.admission.control import Admission
from llmmesh.region.engine_complete import Completion, Generate
from llmmesh.region.policy_cache import Caller
from llmmesh.region.usage_shipper import UsageShipper
from llmmesh.region.zone_store.rows import AssistantMessage
from llmmesh.region.zone_store.store import ZoneStore
from llmmesh.v1 import billing_service_pb2, common_pb2, policy_service_pb2

log = logging.getLogger(__name__)

BACKGROUND_REQUEST_PREFIX = "_"
"""How background usage rows' request ids begin (a tenant's never do)."""
TEMPLATE_ALLOWANCE = 16
"""Tokens a chat template may add per message, besides one per byte of its text."""

BACKGROUND_SKIPPED = Counter(
    "llmmesh_region_background_skipped",
    "Background generations (summaries, memory extraction) skipped because their tenant's daily cap, "
    "monthly quota or TPM limit had no room, or the tenant is unknown, by purpose and reason",
    ["purpose", "reason"],
    registry=region_metrics.REGISTRY,
)
BACKGROUND_TOKENS = Counter(
    "llmmesh_region_background_tokens",
    "Tokens of background generations billed to their tenants, by purpose",
    ["purpose"],
    registry=region_metrics.REGISTRY,
)


def day_start(now: datetime) -> datetime:
    """Midnight UTC of ``now``'s day."""
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def token_bound(turns: list[tuple[str, str]], max_tokens: int) -> int:
    """The most tokens a generation of ``turns`` can use: one per UTF-8 byte
    of their text (no tokenizer the mesh uses makes a token of less), a
    template allowance per message, and ``max_tokens``."""
    return sum(len(text.encode("utf-8")) + TEMPLATE_ALLOWANCE for _, text in turns) + max_tokens


def _timestamp(moment: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(moment)
    return ts


class BackgroundUsage:
    """Runs the tenants' background generations within their limits and bills them."""

    def __init__(
        self,
        region: str,
        store: ZoneStore,
        shipper: UsageShipper,
        admission: Admission,
        tenant: Callable[[str], policy_service_pb2.Tenant | None],
        *,
        default_per_day: int = 200_000,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """``tenant`` finds a tenant's policy by id (the region's policy
        cache); ``default_per_day`` is the daily cap of a tenant whose policy
        sets none (0: none)."""
        self._region = region
        self._store = store
        self._shipper = shipper
        self._admission = admission
        self._tenant = tenant
        self._default_per_day = default_per_day
        self._clock = clock
        self._locks: dict[str, asyncio.Lock] = {}

    async def run(
        self,
        tenant_id: str,
        purpose: str,
        model: str,
        generate: Generate,
        turns: list[tuple[str, str]],
        max_tokens: int,
    ) -> str | None:
        """``generate``'s text for ``turns``, billed to the tenant with
        ``purpose`` (``summary``, ``memory``); None when the tenant's limits
        leave no room for it (skipped, nothing billed)."""
        tenant = self._tenant(tenant_id)
        if tenant is None:
            self._skip(tenant_id, purpose, "unknown_tenant")
            return None
        bound = token_bound(turns, max_tokens)
        lock = self._locks.setdefault(tenant_id, asyncio.Lock())
        async with lock:
            refusal = await self._refusal(tenant, bound)
            if refusal is not None:
                self._skip(tenant_id, purpose, refusal)
                return None
            caller = Caller(tenant, f"background:{tenant_id}")
            try:
                admitted = await self._admission.admit(caller, bound, None, model, slot=False)
            except MeshError as err:
                self._skip(tenant_id, purpose, "quota" if err.reason == Reason.QUOTA_EXCEEDED else "tpm")
                return None
            used = 0
            try:
                done = await generate(turns, max_tokens)
                used = done.input_tokens + done.output_tokens
                await self._record(tenant_id, purpose, model, done)
                return done.text
            finally:
                await admitted.settle(used)
                admitted.release_quota()

    async def _refusal(self, tenant: policy_service_pb2.Tenant, bound: int) -> str | None:
        """Why a generation of at most ``bound`` tokens does not fit the tenant's
        limits; None when it does."""
        now = self._clock()
        per_day = tenant.background_tokens_per_day or self._default_per_day
        if per_day > 0:
            today = await self._store.tenant_tokens(
                tenant.id, day_start(now), request_id_prefix=BACKGROUND_REQUEST_PREFIX
            )
            if today + bound > per_day:
                return "daily_cap"
        quota = tenant.monthly_token_quota
        if quota > 0 and await self._admission.quota.used(tenant.id) + bound > quota:
            return "quota"
        return None

    async def _record(self, tenant_id: str, purpose: str, model: str, done: Completion) -> None:
        request_id = new_id(BACKGROUND_REQUEST_PREFIX + purpose)
        tokens = done.input_tokens + done.output_tokens
        usage = billing_service_pb2.UsageRecord(
            request_id=request_id,
            tenant_id=tenant_id,
            model=model,
            region=self._region,
            usage=common_pb2.TokenUsage(input_tokens=done.input_tokens, output_tokens=done.output_tokens),
            finish_reason=common_pb2.FINISH_REASON_STOP,
            end_time=_timestamp(self._clock()),
            purpose=purpose_proto(purpose),
        ).SerializeToString()
        reply = AssistantMessage(
            content="",
            model=model,
            finish_reason="FINISH_REASON_STOP",
            input_tokens=done.input_tokens,
            output_tokens=done.output_tokens,
        )
        await self._store.record_turn(tenant_id, None, request_id, None, reply, usage, tokens=tokens)
        BACKGROUND_TOKENS.labels(purpose).inc(tokens)
        self._shipper.notify()
        log.info("%s %s for tenant %s: %d tokens billed", purpose, request_id, tenant_id, tokens)

    def _skip(self, tenant_id: str, purpose: str, reason: str) -> None:
        BACKGROUND_SKIPPED.labels(purpose, reason).inc()
        log.warning("tenant %s: %s skipped (%s)", tenant_id, purpose, reason)
        return
