"""``POST /v1/embeddings`` with the official ``openai`` SDK (sync and async,
float and base64) against the in-process stack, 400s naming the param for
bad bodies, billing, and residency: an eu tenant's embeddings run in eu."""

from __future__ import annotations

import asyncio
import math
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from llmmesh.core.embedding_tokens import TOKEN_IDS_HEADER
from tests.edge.sdk import async_client, sync_client
from tests.multiregion import RegionSpec, running_multiregion
from tests.stack import DEV_KEY, Stack

pytestmark = pytest.mark.asyncio
MODEL = "llmmesh-tiny-embed"


def _norm(vector: list[float]) -> float:
    return math.sqrt(sum(x * x for x in vector))


async def test_async_sdk_embeds_strings_and_token_arrays(stack: Stack) -> None:
    async with async_client(stack, DEV_KEY) as client:
        # The SDK asks for base64 by default and decodes it.
        result = await client.embeddings.create(model=MODEL, input=["the quick brown fox", "a lazy dog"])
        assert result.model == MODEL and result.object == "list"
        assert [d.index for d in result.data] == [0, 1]
        assert all(
            len(d.embedding) == 256 and math.isclose(_norm(d.embedding), 1.0, rel_tol=1e-5)
            for d in result.data
        )
        assert result.usage.prompt_tokens == result.usage.total_tokens > 0
        floats = await client.embeddings.create(
            model=MODEL, input="the quick brown fox", encoding_format="float"
        )
        assert floats.data[0].embedding == pytest.approx(result.data[0].embedding, abs=1e-6)
        own_ids = {TOKEN_IDS_HEADER: MODEL}
        tokens = await client.embeddings.create(
            model=MODEL, input=[[5, 6, 7], [8, 9]], dimensions=16, extra_headers=own_ids
        )
        assert [len(d.embedding) for d in tokens.data] == [16, 16]
        assert tokens.usage.prompt_tokens == 5
        single = await client.embeddings.create(
            model=MODEL, input=[5, 6, 7], dimensions=16, extra_headers=own_ids
        )
        assert single.data[0].embedding == pytest.approx(tokens.data[0].embedding, abs=1e-6)


async def test_sync_sdk_embeds(stack: Stack) -> None:
    client = sync_client(stack)
    # The sync client blocks: it runs in a thread while the stack serves on this loop.
    result = await asyncio.to_thread(
        client.embeddings.create, model=MODEL, input="hello", user="u-1", encoding_format="float"
    )
    client.close()
    assert len(result.data) == 1 and len(result.data[0].embedding) == 256


async def test_embeddings_are_billed(stack: Stack) -> None:
    async with async_client(stack, DEV_KEY) as client:
        result = await client.embeddings.create(model=MODEL, input=["one text", "two texts"])
        assert await stack.region.shipper.flush(timeout_s=10)
        tenant = stack.region.policy.authenticate(DEV_KEY).tenant_id
        billed = await stack.global_plane.ledger.usage(tenant, "")
        assert (billed.input_tokens, billed.output_tokens, billed.requests) == (
            result.usage.prompt_tokens,
            0,
            1,
        )
        assert billed.cost_usd > 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": ""}, "input"),
        ({"model": MODEL, "input": []}, "input"),
        ({"model": MODEL, "input": ["ok", ""]}, "input"),
        ({"model": MODEL, "input": [[]]}, "input"),
        ({"model": MODEL, "input": [1, -2]}, "input"),
        ({"model": MODEL, "input": [True]}, "input"),
        ({"model": MODEL, "input": [{"text": "x"}]}, "input"),
        ({"model": MODEL, "input": ["x"] * 2049}, "input"),
        ({"model": MODEL, "input": [[10**7]]}, "input"),
        ({"input": "x"}, "model"),
        ({"model": "llmmesh-tiny", "input": "x"}, "model"),
        ({"model": MODEL, "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": MODEL, "input": "x", "dimensions": 0}, "dimensions"),
        ({"model": MODEL, "input": "x", "dimensions": "8"}, "dimensions"),
        ({"model": MODEL, "input": "x", "dimensions": 257}, "dimensions"),
        ({"model": MODEL, "input": "x", "user": 5}, "user"),
        ({"model": MODEL, "input": "x", "truncate": True}, "truncate"),
    ],
)
async def test_bad_bodies_are_400s_naming_the_param(stack: Stack, body: dict[str, Any], param: str) -> None:
    assert stack.edge is not None
    async with httpx.AsyncClient(base_url=stack.edge.url, timeout=30) as http:
        resp = await http.post("/v1/embeddings", json=body, headers={"authorization": f"Bearer {DEV_KEY}"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


async def test_tiktoken_ids_as_langchain_sends_them_are_refused(stack: Stack) -> None:
    assert stack.edge is not None
    # LangChain's OpenAIEmbeddings: cl100k_base ids of "hello world", base64 asked by the SDK.
    body = {"input": [[15339, 1917]], "model": MODEL, "encoding_format": "base64"}
    key = {"authorization": f"Bearer {DEV_KEY}"}
    async with httpx.AsyncClient(base_url=stack.edge.url, timeout=30) as http:
        refused = await http.post("/v1/embeddings", json=body, headers=key)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == "input" and "check_embedding_ctx_length=False" in error["message"]
        other = await http.post("/v1/embeddings", json=body, headers={**key, TOKEN_IDS_HEADER: "cl100k_base"})
        assert other.status_code == 400 and other.json()["error"]["param"] == TOKEN_IDS_HEADER
        text = await http.post("/v1/embeddings", json={**body, "input": ["hello world"]}, headers=key)
        assert text.status_code == 200 and text.json()["usage"]["prompt_tokens"] > 0


async def test_an_unknown_model_is_a_404_and_no_key_a_401(stack: Stack) -> None:
    async with async_client(stack, DEV_KEY) as client:
        with pytest.raises(openai.NotFoundError) as missing:
            await client.embeddings.create(model="text-embedding-3-small", input="x")
        assert missing.value.body["param"] == "model"  # type: ignore[index]
    async with async_client(stack, "sk-wrong") as anonymous:
        with pytest.raises(openai.AuthenticationError):
            await anonymous.embeddings.create(model=MODEL, input="x")


async def test_an_eu_tenants_embeddings_run_in_eu(tmp_path: Path) -> None:
    specs = [RegionSpec("us-east", "us"), RegionSpec("eu-west", "eu")]
    async with running_multiregion(specs, store_dir=tmp_path) as mesh:
        tenant_id, secret = await mesh.new_key("eu")
        async with httpx.AsyncClient(base_url=mesh.url, timeout=30) as http:
            resp = await http.post(
                "/v1/embeddings",
                json={"model": MODEL, "input": f"residency {uuid.uuid4().hex}", "encoding_format": "float"},
                headers={"authorization": f"Bearer {secret}"},
            )
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-llmmesh-region"] == "eu-west"
        request_id = resp.headers["x-request-id"]
        eu_rows = [row.request_id for row in await mesh.store("eu").pending_usage()]
        us_rows = [row.request_id for row in await mesh.store("us").pending_usage()]
        assert request_id in eu_rows and request_id not in us_rows
        assert tenant_id
