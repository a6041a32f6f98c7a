"""OpenAI's ``x-ratelimit-*`` headers: the region reports the key's figures
in ``ChatStarted.rate_limit`` and the edge sends them on chat completions
and conversation messages."""

from __future__ import annotations

import re

import httpx
import pytest

from llmmesh.edge.ratelimit_headers import ratelimit_headers, reset_text
from llmmesh.region.admission.rate_limit_status import rate_limit_status
from llmmesh.region.admission.ratelimit import Reservation
from llmmesh.v1 import chat_service_pb2
from tests.edge.test_conversations_api import new_tenant
from tests.stack import DEV_KEY, Stack

RPM, TPM = 50, 40_000
BODY = {"model": "auto", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
RESET = re.compile(r"^(\d+h)?(\d+m)?(\d+(\.\d+)?s|\d+ms)$")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (-1, "0s"),
        (0.0004, "0s"),
        (0.02, "20ms"),
        (0.999, "999ms"),
        (1, "1s"),
        (2.5, "2.5s"),
        (59.001, "59.001s"),
        (60, "1m0s"),
        (360, "6m0s"),
        (61.25, "1m1.25s"),
        (3600, "1h0m0s"),
        (3725, "1h2m5s"),
    ],
)
def test_resets_are_written_as_openai_does(seconds: float, text: str) -> None:
    assert reset_text(seconds) == text


def test_the_region_reports_its_reservation() -> None:
    reservation = Reservation("key_1", 120, 60, 59, 1000, 880, 60.0, 0.5)
    status = rate_limit_status(reservation)
    assert (status.limit_requests, status.remaining_requests) == (60, 59)
    assert (status.limit_tokens, status.remaining_tokens) == (1000, 880)
    assert status.reset_requests.ToTimedelta().total_seconds() == 60.0
    assert status.reset_tokens.ToMilliseconds() == 500
    headers = ratelimit_headers(chat_service_pb2.ChatStarted(rate_limit=status))
    assert headers == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1m0s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "880",
        "x-ratelimit-reset-tokens": "500ms",
    }


def test_an_unlimited_figure_sends_no_headers() -> None:
    only_tokens = chat_service_pb2.RateLimitStatus(limit_tokens=100, remaining_tokens=90)
    headers = ratelimit_headers(chat_service_pb2.ChatStarted(rate_limit=only_tokens))
    assert set(headers) == {
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    }
    assert ratelimit_headers(chat_service_pb2.ChatStarted()) == {}


def figures(resp: httpx.Response) -> tuple[int, int]:
    """The remaining requests and tokens a response reports, its limits checked."""
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-ratelimit-limit-requests"] == str(RPM)
    assert resp.headers["x-ratelimit-limit-tokens"] == str(TPM)
    for kind in ("requests", "tokens"):
        assert RESET.match(resp.headers[f"x-ratelimit-reset-{kind}"]), resp.headers
    return int(resp.headers["x-ratelimit-remaining-requests"]), int(
        resp.headers["x-ratelimit-remaining-tokens"]
    )


@pytest.mark.asyncio
async def test_headers_count_down_across_completions_and_conversation_messages(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    auth = {"authorization": f"Bearer {await new_tenant(stack, 'limited', rpm_limit=RPM, tpm_limit=TPM)}"}
    remaining = [figures(await http.post("/v1/chat/completions", json=BODY, headers=auth))]
    remaining.append(
        figures(await http.post("/v1/chat/completions", json={**BODY, "stream": True}, headers=auth))
    )
    conversation = (await http.post("/v1/conversations", json={}, headers=auth)).json()
    for stream in (False, True):
        resp = await http.post(
            f"/v1/conversations/{conversation['id']}/messages",
            json={"content": "Hello", "max_tokens": 8, "stream": stream},
            headers=auth,
        )
        remaining.append(figures(resp))
    requests_left = [r for r, _ in remaining]
    assert requests_left == list(range(RPM - 1, RPM - 1 - len(remaining), -1))
    tokens_left = [t for _, t in remaining]
    assert tokens_left == sorted(set(tokens_left), reverse=True)
    assert tokens_left[0] < TPM


@pytest.mark.asyncio
async def test_an_unlimited_key_gets_no_ratelimit_headers(http: httpx.AsyncClient) -> None:
    resp = await http.post("/v1/chat/completions", json=BODY, headers={"authorization": f"Bearer {DEV_KEY}"})
    assert resp.status_code == 200
    assert not [name for name in resp.headers if name.startswith("x-ratelimit-")]
