"""A turn the region refuses for its key's rate limits is answered 429 with
``retry-after`` and OpenAI's six ``x-ratelimit-*`` headers, from the figures
the refusal carries as ErrorInfo metadata; other 429s carry none."""

from __future__ import annotations

import httpx
import pytest

from llmmesh.core.errors import Reason, ResourceExhausted
from llmmesh.edge.errors import from_mesh_error
from llmmesh.edge.ratelimit_headers import refusal_ratelimit_headers
from tests.edge.test_conversations_api import new_tenant
from tests.edge.test_ratelimit_headers import RESET
from tests.stack import Stack

RPM, TPM = 2, 40_000
BODY = {"model": "auto", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
FIGURES = {
    "limit": "requests",
    "limit_value": "60",
    "limit_requests": "60",
    "remaining_requests": "0",
    "reset_requests_ms": "1500",
    "limit_tokens": "90000",
    "remaining_tokens": "89100",
    "reset_tokens_ms": "360000",
}
HEADERS = {
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-reset-requests": "1.5s",
    "x-ratelimit-limit-tokens": "90000",
    "x-ratelimit-remaining-tokens": "89100",
    "x-ratelimit-reset-tokens": "6m0s",
}


def test_a_rate_limit_refusal_maps_to_the_six_headers_and_retry_after() -> None:
    error = from_mesh_error(
        ResourceExhausted(Reason.RATE_LIMITED, "slow", metadata=FIGURES, retry_after_s=0.4)
    )
    assert error.status == 429
    response = error.response()
    assert {name: response.headers[name] for name in HEADERS} == HEADERS
    assert response.headers["retry-after"] == "1"
    assert {name: value for name, value in error.headers().items() if name != "retry-after-ms"} == {
        **HEADERS,
        "retry-after": "1",
    }


@pytest.mark.parametrize("reason", [Reason.QUOTA_EXCEEDED, Reason.OVERLOADED])
def test_other_429s_carry_no_ratelimit_headers(reason: Reason) -> None:
    error = from_mesh_error(ResourceExhausted(reason, "no", metadata=FIGURES, retry_after_s=2.0))
    assert error.status == 429
    assert set(error.headers()) == {"retry-after", "retry-after-ms"}
    assert error.headers()["retry-after"] == "2"


def test_an_unlimited_or_incomplete_dimension_gets_no_headers() -> None:
    unlimited_requests = {**FIGURES, "limit_requests": "0"}
    assert set(refusal_ratelimit_headers(unlimited_requests)) == {
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    }
    no_token_reset = {k: v for k, v in FIGURES.items() if k != "reset_tokens_ms"}
    assert set(refusal_ratelimit_headers(no_token_reset)) == {
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
    }
    assert refusal_ratelimit_headers({**FIGURES, "remaining_requests": "-1", "limit_tokens": "lots"}) == {}
    # A refusal that carries no figures (a request larger than the whole limit) gets none.
    assert refusal_ratelimit_headers({"limit": "tokens", "limit_value": "100", "requested": "101"}) == {}


def remaining_tokens(resp: httpx.Response) -> int:
    assert resp.status_code == 200, resp.text
    return int(resp.headers["x-ratelimit-remaining-tokens"])


@pytest.mark.asyncio
async def test_a_key_past_its_rpm_gets_a_429_with_the_six_headers(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    auth = {"authorization": f"Bearer {await new_tenant(stack, 'tight', rpm_limit=RPM, tpm_limit=TPM)}"}
    accepted = [await http.post("/v1/chat/completions", json=BODY, headers=auth) for _ in range(RPM)]
    left_after_admissions = min(remaining_tokens(resp) for resp in accepted)
    for stream in (False, True):
        resp = await http.post("/v1/chat/completions", json={**BODY, "stream": stream}, headers=auth)
        assert resp.status_code == 429, resp.text
        assert resp.json()["error"]["code"] == "rate_limit_exceeded"
        assert int(resp.headers["retry-after"]) >= 1
        assert resp.headers["x-ratelimit-limit-requests"] == str(RPM)
        assert resp.headers["x-ratelimit-remaining-requests"] == "0"
        assert resp.headers["x-ratelimit-limit-tokens"] == str(TPM)
        # The finished turns gave back what they reserved and did not use:
        # at least as many tokens are left as after their admissions.
        assert left_after_admissions <= int(resp.headers["x-ratelimit-remaining-tokens"]) < TPM
        for kind in ("requests", "tokens"):
            assert RESET.match(resp.headers[f"x-ratelimit-reset-{kind}"]), resp.headers
