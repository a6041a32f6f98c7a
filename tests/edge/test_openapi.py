"""The OpenAPI document and ``/docs`` cover every route of the edge, and the
chat request schema every parameter of OpenAI's reference."""

from __future__ import annotations

import re

import httpx
import pytest
from openai.types.chat.completion_create_params import CompletionCreateParamsBase
from starlette.routing import Route

from llmmesh.edge.app import build_app
from llmmesh.edge.mesh_client import MeshClient
from llmmesh.edge.openapi.document import openapi_document
from llmmesh.edge.settings import EdgeSettings

UNDOCUMENTED: set[tuple[str, str]] = set()


async def app_operations() -> set[tuple[str, str]]:
    settings = EdgeSettings(port=0, global_address="127.0.0.1:1", insecure=True)
    mesh = MeshClient(settings.global_address)
    app = build_app(settings, mesh)
    await mesh.close()
    operations = set()
    for route in app.routes:
        assert isinstance(route, Route)
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
        operations |= {(method, path) for method in route.methods or () if method != "HEAD"}
    return operations


@pytest.mark.asyncio
async def test_every_route_is_documented() -> None:
    paths = openapi_document()["paths"]
    documented = {
        (method.upper(), path) for path, item in paths.items() for method in item if method != "parameters"
    }
    assert await app_operations() - UNDOCUMENTED == documented


def test_the_chat_request_schema_has_every_parameter_of_the_reference() -> None:
    document = openapi_document()
    schema = document["components"]["schemas"]["ChatCompletionRequest"]
    assert set(CompletionCreateParamsBase.__annotations__) | {"stream"} <= set(schema["properties"])
    assert schema["additionalProperties"] is False
    # A refused parameter says so.
    assert "Refused" in schema["properties"]["audio"]["description"]


@pytest.mark.asyncio
async def test_docs_is_an_html_reference_of_every_operation(http: httpx.AsyncClient) -> None:
    resp = await http.get("/docs")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    for path in openapi_document()["paths"]:
        assert path in resp.text
    assert "tool_choice" in resp.text and "response_format" in resp.text
