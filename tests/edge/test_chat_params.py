"""Every Chat Completions parameter of OpenAI's reference is honoured (it
reaches the contract's SamplingParams or ChatMessage) or refused with a 400
naming it; an unknown one is a 400 too."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.schemas import parse_chat_request
from llmmesh.v1 import common_pb2

OK: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": True,
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def sampling(**params: Any) -> common_pb2.SamplingParams:
    return parse_chat_request({**OK, **params}).to_sampling()


def refusal(body: dict[str, Any]) -> OpenAIError:
    def translate() -> None:
        request = parse_chat_request(body)
        request.to_sampling()
        request.to_messages()

    with pytest.raises(OpenAIError) as info:
        translate()
    assert info.value.status == 400
    return info.value


def test_penalties_logit_bias_and_logprobs_reach_the_sampling_parameters() -> None:
    got = sampling(
        presence_penalty=0.5,
        frequency_penalty=-1,
        logit_bias={"15": -100, "7": 2.5},
        logprobs=True,
        top_logprobs=3,
    )
    assert got.presence_penalty == 0.5 and got.frequency_penalty == -1.0
    assert dict(got.logit_bias) == {15: -100.0, 7: 2.5}
    assert got.logprobs is True and got.top_logprobs == 3
    plain = sampling()
    assert not plain.HasField("presence_penalty") and not plain.HasField("top_logprobs")
    assert not plain.logprobs and not plain.logit_bias


def test_function_tools_and_each_tool_choice() -> None:
    auto = sampling(tools=[WEATHER, TIME])
    assert [t.name for t in auto.tools] == ["get_weather", "get_time"]
    assert json.loads(auto.tools[0].parameters_json)["required"] == ["city"]
    assert auto.tools[0].strict and auto.tools[0].description == "The weather in a city."
    assert auto.tools[1].parameters_json == ""
    assert auto.tool_choice.mode == common_pb2.TOOL_CHOICE_MODE_UNSPECIFIED
    for choice, mode in (
        ("none", common_pb2.TOOL_CHOICE_MODE_NONE),
        ("auto", common_pb2.TOOL_CHOICE_MODE_AUTO),
        ("required", common_pb2.TOOL_CHOICE_MODE_REQUIRED),
    ):
        assert sampling(tools=[WEATHER], tool_choice=choice).tool_choice.mode == mode
    named = sampling(
        tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}
    )
    assert (named.tool_choice.mode, named.tool_choice.name) == (common_pb2.TOOL_CHOICE_MODE_NAMED, "get_time")
    allowed = sampling(
        tools=[WEATHER, TIME],
        tool_choice={
            "type": "allowed_tools",
            "allowed_tools": {
                "mode": "required",
                "tools": [{"type": "function", "function": {"name": "get_time"}}],
            },
        },
        parallel_tool_calls=False,
    )
    assert [t.name for t in allowed.tools] == ["get_time"]
    assert allowed.tool_choice.mode == common_pb2.TOOL_CHOICE_MODE_REQUIRED
    assert allowed.HasField("parallel_tool_calls") and not allowed.parallel_tool_calls


def test_response_formats() -> None:
    assert (
        sampling(response_format={"type": "text"}).response_format.type
        == common_pb2.RESPONSE_FORMAT_TYPE_TEXT
    )
    assert (
        sampling(response_format={"type": "json_object"}).response_format.type
        == common_pb2.RESPONSE_FORMAT_TYPE_JSON_OBJECT
    )
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = sampling(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "count", "schema": schema, "strict": True},
        }
    ).response_format
    assert (fmt.type, fmt.schema_name, fmt.strict) == (
        common_pb2.RESPONSE_FORMAT_TYPE_JSON_SCHEMA,
        "count",
        True,
    )
    assert json.loads(fmt.schema_json) == schema


def test_tool_messages_and_assistant_tool_calls_reach_the_contract() -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
    }
    request = parse_chat_request(
        {
            **OK,
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "12 C"},
            ],
        }
    )
    developer, _, assistant, tool = request.to_messages()
    assert developer.role == common_pb2.CHAT_ROLE_DEVELOPER and developer.content == "Be brief."
    assert assistant.content == "" and len(assistant.tool_calls) == 1
    assert (assistant.tool_calls[0].id, assistant.tool_calls[0].name) == ("call_1", "get_weather")
    assert assistant.tool_calls[0].arguments == '{"city":"Oslo"}'
    assert (tool.role, tool.tool_call_id, tool.content) == (common_pb2.CHAT_ROLE_TOOL, "call_1", "12 C")


def test_harmless_settings_of_refusable_parameters_are_honoured() -> None:
    got = sampling(
        n=1,
        modalities=["text"],
        store=False,
        service_tier="auto",
        reasoning_effort="none",
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
        max_completion_tokens=5,
        stop=["a", "b"],
    )
    assert got.max_tokens == 5 and list(got.stop) == ["a", "b"]
    request = parse_chat_request({**OK, "safety_identifier": "u-1", "user": "legacy"})
    assert request.end_user() == "u-1"


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"n": 2}, "n"),
        ({"n": 0}, "n"),
        ({"audio": {"voice": "alloy", "format": "mp3"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"verbosity": "loud"}, "verbosity"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"store": True}, "store"),
        ({"metadata": {"k": "v"}}, "metadata"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"prompt_cache_key": "k"}, "prompt_cache_key"),
        ({"prompt_cache_retention": "24h"}, "prompt_cache_retention"),
        ({"prompt_cache_options": {"mode": "explicit"}}, "prompt_cache_options"),
        ({"moderation": {"model": "m"}}, "moderation"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        (
            {"stream": True, "stream_options": {"include_obfuscation": True}},
            "stream_options.include_obfuscation",
        ),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias.5"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice.function.name",
        ),
        ({"parallel_tool_calls": True}, "parallel_tool_calls"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"response_format": {"type": "grammar"}}, "response_format.type"),
        ({"top_k": 5}, "top_k"),
    ],
)
def test_refused_and_invalid_parameters_are_named(params: dict[str, Any], param: str) -> None:
    assert refusal({**OK, **params}).param == param


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "function", "name": "f", "content": "x"}, "messages[0].role"),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
            "messages[0].content[0].type",
        ),
        (
            {"role": "user", "content": [{"type": "text", "text": "x", "prompt_cache_breakpoint": {}}]},
            "messages[0].content[0].prompt_cache_breakpoint",
        ),
        ({"role": "tool", "content": "x"}, "messages[0].tool_call_id"),
        ({"role": "user", "content": "x", "tool_call_id": "c"}, "messages[0].tool_call_id"),
        ({"role": "user"}, "messages[0].content"),
        (
            {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}},
            "messages[0].function_call",
        ),
        ({"role": "assistant", "audio": {"id": "a"}}, "messages[0].audio"),
        ({"role": "user", "content": "x", "extra": 1}, "messages[0].extra"),
    ],
)
def test_refused_message_fields_are_named(message: dict[str, Any], param: str) -> None:
    assert refusal({**OK, "messages": [message]}).param == param


def test_an_unknown_parameter_is_refused_as_unknown() -> None:
    error = refusal({**OK, "temprature": 1})
    assert (error.param, error.code) == ("temprature", "unknown_parameter")
