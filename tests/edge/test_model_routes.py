"""``GET /v1/models/{model}`` and the endpoints the mesh does not serve,
through the official SDK and plain HTTP."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.edge.sdk import async_client
from tests.stack import DEV_KEY, Stack

pytestmark = pytest.mark.asyncio
AUTH = {"Authorization": f"Bearer {DEV_KEY}"}


async def test_one_model_is_the_listed_object_and_an_unknown_one_is_model_not_found(stack: Stack) -> None:
    async with async_client(stack) as client:
        listed = {m.id: m for m in (await client.models.list()).data}
        model = await client.models.retrieve("llmmesh-tiny")
        assert model.model_dump() == listed["llmmesh-tiny"].model_dump()
        assert model.object == "model" and model.id == "llmmesh-tiny"
        with pytest.raises(openai.NotFoundError) as missing:
            await client.models.retrieve("no-such-model")
    assert missing.value.code == "model_not_found"
    assert missing.value.param == "model"


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/completions"), ("POST", "/v1/responses"), ("GET", "/v1/responses/resp_1")],
)
async def test_unsupported_endpoints_say_so(http: httpx.AsyncClient, method: str, path: str) -> None:
    resp = await http.request(method, path, headers=AUTH, json={"model": "auto", "prompt": "hi"})
    assert resp.status_code == 404
    error = resp.json()["error"]
    assert error["code"] == "unsupported_endpoint"
    assert "/v1/chat/completions" in error["message"]
    assert (await http.request(method, path)).status_code == 401


async def test_the_sdk_sees_a_not_found_error_for_legacy_completions(stack: Stack) -> None:
    async with async_client(stack) as client:
        with pytest.raises(openai.NotFoundError) as refused:
            await client.completions.create(model="auto", prompt="hi")
    assert refused.value.code == "unsupported_endpoint"
