"""Whether billing saw what the clients received.

Before the traffic the drill reads ``GET /v1/usage`` for every key (and
keeps its period, so a month's turn does not split the count); after the
traffic it reads again until the billed output tokens have grown by at
least the tokens the clients received and stopped moving, and until
billing's ``ReconcileUsage`` knows every request id the drill asks about —
or until the wait runs out. Regions ship usage asynchronously (and after a
global-plane outage, from their outbox), hence the wait. The figures
assume the drill's tenants have no other traffic meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import grpc
import grpc.aio
import httpx

from llmmesh.drill.target import Dial
from llmmesh.v1 import billing_service_pb2 as bpb
from llmmesh.v1 import billing_service_pb2_grpc

POLL_S = 1.0
CALL_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class UsageSnapshot:
    """Billed output tokens per key, and the period they count."""

    output_tokens: Mapping[str, int]
    periods: Mapping[str, str]


@dataclass(frozen=True)
class UsageCheck:
    """What billing held once it caught up, or once the wait ran out."""

    billed_output_tokens: int | None
    """Output tokens billed during the drill; None when usage could not be read."""
    received_output_tokens: int
    caught_up: bool
    """Whether billing reached the received tokens, stopped moving and knew every record asked about."""
    waited_s: float
    records_missing: int | None
    """Request ids asked about that billing still lacks; None when it could not be asked."""


async def read_usage(http: httpx.AsyncClient, secrets: Sequence[str]) -> UsageSnapshot | None:
    """Every key's billed output tokens this period; None when any cannot be read."""
    tokens: dict[str, int] = {}
    periods: dict[str, str] = {}
    for secret in secrets:
        found = await _usage(http, secret, "")
        if found is None:
            return None
        tokens[secret], periods[secret] = found
    return UsageSnapshot(tokens, periods)


async def _usage(http: httpx.AsyncClient, secret: str, period: str) -> tuple[int, str] | None:
    try:
        resp = await http.get(
            "/v1/usage",
            params={"period": period} if period else None,
            headers={"authorization": f"Bearer {secret}"},
            timeout=CALL_TIMEOUT_S,
        )
        body = resp.json()
    except (httpx.HTTPError, ValueError):
        return None
    if resp.status_code != 200 or not isinstance(body, dict):
        return None
    return int(body.get("output_tokens", 0)), str(body.get("period", ""))


async def _billed_since(http: httpx.AsyncClient, before: UsageSnapshot) -> int | None:
    total = 0
    for secret, tokens in before.output_tokens.items():
        found = await _usage(http, secret, before.periods[secret])
        if found is None:
            return None
        total += found[0] - tokens
    return total


async def _missing_records(dial: Dial, request_ids: Sequence[str]) -> int | None:
    if not request_ids:
        return 0
    async with dial() as channel:
        billing = billing_service_pb2_grpc.BillingServiceStub(channel)
        try:
            resp = await billing.ReconcileUsage(
                bpb.ReconcileUsageRequest(region="drill", request_ids=list(request_ids)),
                timeout=CALL_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError:
            return None
    return len(resp.missing_request_ids)


async def wait_for_billing(
    http: httpx.AsyncClient,
    dial: Dial,
    before: UsageSnapshot | None,
    received_output_tokens: int,
    request_ids: Sequence[str],
    wait_s: float,
) -> UsageCheck:
    """Poll until billing caught up with the drill (see the module docstring),
    at most ``wait_s``; ``dial`` opens a channel to the global plane."""
    began = time.monotonic()
    deadline = began + wait_s
    last: int | None = None
    billed: int | None = None
    missing: int | None = None
    caught_up = False
    for _ in range(int(wait_s / POLL_S) + 2):
        billed = await _billed_since(http, before) if before is not None else None
        missing = await _missing_records(dial, request_ids)
        settled = before is None or (
            billed is not None and billed >= received_output_tokens and billed == last
        )
        caught_up = settled and missing == 0
        if caught_up or time.monotonic() >= deadline:
            break
        last = billed
        await asyncio.sleep(POLL_S)
    return UsageCheck(billed, received_output_tokens, caught_up, time.monotonic() - began, missing)
