"""``GET /v1/models/{model}`` through the official SDK."""

from __future__ import annotations

import httpx
import openai
import pytest

from llmmesh.globalplane.tiers import TenantTier
from tests.edge.sdk import async_client
from tests.stack import DEV_KEY, Stack

pytestmark = pytest.mark.asyncio(loop_scope="module")
AUTH = {"authorization": f"Bearer {DEV_KEY}"}
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 10}


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    """One mesh for the module's tests: none leaves anything another reads."""
    return shared_stack


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


async def test_a_callers_zone_lists_only_the_models_its_regions_serve(stack: Stack) -> None:
    async with async_client(stack) as client:
        tiny = next(m for m in (await client.models.list()).data if m.id == "llmmesh-tiny")
    assert tiny.model_dump()["regions"] == ["us-east"]
    # A tenant of a zone no region serves sees no model, and no model by name either.
    book = stack.global_plane.tenants
    tenant = await book.create_tenant("models-elsewhere", "eu", TenantTier.PRO)
    _, secret = await book.create_api_key(tenant.id)
    async with async_client(stack, secret) as elsewhere:
        assert (await elsewhere.models.list()).data == []
        with pytest.raises(openai.NotFoundError) as missing:
            await elsewhere.models.retrieve("llmmesh-tiny")
    assert (missing.value.code, missing.value.param) == ("model_not_found", "model")
    assert "not served in your zone (eu)" in missing.value.message


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/chat/completions", {**CHAT, "stream": True}),
        ("/v1/responses", {"model": "auto", "input": "Hello", "max_output_tokens": 10}),
        ("/v1/completions", {"model": "auto", "prompt": "Hello", "max_tokens": 10}),
    ],
)
async def test_a_turn_on_the_embedding_model_is_a_400_naming_the_model(
    shared_http: httpx.AsyncClient, path: str, body: dict[str, object]
) -> None:
    resp = await shared_http.post(path, json={**body, "model": "llmmesh-tiny-embed"}, headers=AUTH)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["code"], error["param"]) == ("model_wrong_kind", "model")
    assert "embedding model" in error["message"]
