"""EngineService refuses bad tool, response-format, penalty, logit-bias and
logprob parameters with INVALID_ARGUMENT naming the param, over a real
``grpc.aio`` server on port 0."""

from __future__ import annotations

import json
from typing import Any

import grpc
import grpc.aio
import pytest

from llmmesh.core.errors import from_rpc_error
from llmmesh.v1 import common_pb2 as c
from llmmesh.v1 import engine_service_pb2 as pb
from llmmesh.v1 import engine_service_pb2_grpc as pb_grpc
from tests.engine.test_servicer import stub
from tests.engine.test_servicer_features import CLOCK, REQUIRED, generate, start

pytestmark = pytest.mark.asyncio
__all__ = ["stub"]  # the fixture, imported to be used here

BAD_SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "string", "pattern": "^(?=x)"}}})


@pytest.mark.parametrize(
    ("sampling", "param"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"logit_bias": {5: 101.0}}, "logit_bias"),
        ({"logit_bias": {10**6: 1.0}}, "logit_bias"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"tools": [c.ToolDefinition(name="bad name")]}, "tools[0].function.name"),
        ({"tools": [CLOCK, CLOCK]}, "tools[1].function.name"),
        ({"tools": [c.ToolDefinition(name="f", parameters_json="[1]")]}, "tools[0].function.parameters"),
        ({"tools": [c.ToolDefinition(name="f", parameters_json="{")]}, "tools[0].function.parameters"),
        (
            {"tools": [CLOCK], "tool_choice": c.ToolChoice(mode=c.TOOL_CHOICE_MODE_NAMED, name="x")},
            "tool_choice",
        ),
        ({"tool_choice": REQUIRED}, "tool_choice"),
        ({"tools": [CLOCK], "tool_choice": c.ToolChoice(name="get_time")}, "tool_choice"),
        ({"tools": [CLOCK], "tool_choice": c.ToolChoice(mode=c.ToolChoiceMode.ValueType(7))}, "tool_choice"),
        (
            {"tools": [CLOCK], "tool_choice": c.ToolChoice(mode=c.TOOL_CHOICE_MODE_AUTO, name="get_time")},
            "tool_choice",
        ),
        (
            {"response_format": c.ResponseFormat(type=c.RESPONSE_FORMAT_TYPE_JSON_SCHEMA)},
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": c.ResponseFormat(type=c.RESPONSE_FORMAT_TYPE_JSON_SCHEMA, schema_json='"x"')},
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": c.ResponseFormat(type=c.RESPONSE_FORMAT_TYPE_JSON_OBJECT, schema_json="{}")},
            "response_format",
        ),
        ({"response_format": c.ResponseFormat(type=c.ResponseFormatType.ValueType(9))}, "response_format"),
        (
            {
                "response_format": c.ResponseFormat(
                    type=c.RESPONSE_FORMAT_TYPE_JSON_SCHEMA, schema_json=BAD_SCHEMA
                )
            },
            "response_format.json_schema.schema",
        ),
        (
            {"tools": [c.ToolDefinition(name="f", parameters_json=BAD_SCHEMA)], "tool_choice": REQUIRED},
            "tools[0].function.parameters",
        ),
    ],
)
async def test_bad_feature_params_are_refused_naming_the_param(
    stub: pb_grpc.EngineServiceAsyncStub, sampling: dict[str, Any], param: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await generate(stub, start(**sampling))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    error = from_rpc_error(raised.value)
    assert (error.reason, error.metadata.get("param")) == ("INVALID_SAMPLING", param)


async def test_messages_with_tool_parts_are_refused(stub: pb_grpc.EngineServiceAsyncStub) -> None:
    message = pb.GenerateStart(
        request_id="r",
        messages=[c.ChatMessage(role=c.CHAT_ROLE_TOOL, content="noon", tool_call_id="call_1")],
    )
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await generate(stub, message)
    error = from_rpc_error(raised.value)
    assert (error.reason, error.metadata.get("param")) == ("INVALID_REQUEST", "messages")


async def test_tokenize_refuses_messages_with_tool_parts(stub: pb_grpc.EngineServiceAsyncStub) -> None:
    call = c.ToolCall(id="call_1", name="get_time", arguments="{}")
    request = pb.TokenizeRequest(messages=[c.ChatMessage(role=c.CHAT_ROLE_ASSISTANT, tool_calls=[call])])
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.Tokenize(request)
    error = from_rpc_error(raised.value)
    assert (error.reason, error.metadata.get("param")) == ("INVALID_REQUEST", "messages")
