"""Values no model, period or list item could have are refused at the edge
as 400s naming the parameter: sent on, a huge one came back from a plane
as gRPC's RESOURCE_EXHAUSTED (its status outgrew the metadata limit), which
the edge answered as a 429 that SDKs retry forever."""

from __future__ import annotations

import grpc
import httpx
import pytest

from llmmesh.core.errors import MeshError
from llmmesh.edge.errors import from_mesh_error
from llmmesh.edge.mesh_client import MeshClient
from tests.stack import DEV_KEY, Stack

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    """One mesh for the module's tests: none leaves anything another reads."""
    return shared_stack


@pytest.fixture
def http(shared_http: httpx.AsyncClient) -> httpx.AsyncClient:
    return shared_http


AUTH = {"authorization": f"Bearer {DEV_KEY}"}
HELLO = [{"role": "user", "content": "Hello"}]
HUGE = "x" * 20_000


def refused(resp: httpx.Response, param: str) -> None:
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, "invalid_value")
    assert len(error["message"]) < 300


@pytest.mark.parametrize("model", [HUGE, "m" * 129, "two words", "-dash-first", "nul\x00"])
async def test_a_model_name_no_model_could_have_is_a_400(http: httpx.AsyncClient, model: str) -> None:
    conversation = (await http.post("/v1/conversations", json={}, headers=AUTH)).json()
    chat = await http.post("/v1/chat/completions", json={"model": model, "messages": HELLO}, headers=AUTH)
    refused(chat, "model")
    refused(await http.post("/v1/conversations", json={"model": model}, headers=AUTH), "model")
    message = {"content": "Hello", "model": model}
    path = f"/v1/conversations/{conversation['id']}/messages"
    refused(await http.post(path, json=message, headers=AUTH), "model")


async def test_names_the_registry_allows_still_resolve(http: httpx.AsyncClient) -> None:
    for model in ("auto", "llmmesh-tiny"):
        body = {"model": model, "messages": HELLO, "max_tokens": 2}
        assert (await http.post("/v1/chat/completions", json=body, headers=AUTH)).status_code == 200
    unknown = await http.post(
        "/v1/chat/completions", json={"model": "org/some-model:v1.5", "messages": HELLO}, headers=AUTH
    )
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "model_not_found")


async def test_list_positions_and_usage_periods_are_bounded(http: httpx.AsyncClient) -> None:
    conversation = (await http.post("/v1/conversations", json={}, headers=AUTH)).json()
    refused(await http.get("/v1/conversations", params={"after": HUGE}, headers=AUTH), "after")
    messages = f"/v1/conversations/{conversation['id']}/messages"
    refused(await http.get(messages, params={"after": HUGE}, headers=AUTH), "after")
    refused(await http.get("/v1/usage", params={"period": HUGE}, headers=AUTH), "period")
    refused(await http.get("/v1/usage", params={"period": "2031-13"}, headers=AUTH), "period")
    assert (await http.get("/v1/usage", params={"period": "2031-12"}, headers=AUTH)).status_code == 200


async def test_grpcs_own_resource_exhausted_is_no_429(stack: Stack) -> None:
    # A status whose message echoes 20,000 characters is past the client's
    # metadata limit: gRPC itself fails the call, without ErrorInfo or RetryInfo.
    mesh = MeshClient(stack.global_plane.address)
    try:
        with pytest.raises(MeshError) as raised:
            await mesh.usage("dev", HUGE)
    finally:
        await mesh.close()
    assert raised.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    error = from_mesh_error(raised.value)
    assert (error.status, error.type, error.code) == (400, "invalid_request_error", "request_too_large")
    assert "metadata" not in error.message
