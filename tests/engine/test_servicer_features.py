"""EngineService with tools, structured output, logprobs, penalties and logit
bias, over a real ``grpc.aio`` server on port 0 serving the simulator."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import jsonschema  # type: ignore[import-untyped]
import pytest

from llmmesh.core.errors import from_rpc_error
from llmmesh.engine.sim.tokenizer import SimTokenizer
from llmmesh.v1 import common_pb2 as c
from llmmesh.v1 import engine_service_pb2 as pb
from llmmesh.v1 import engine_service_pb2_grpc as pb_grpc
from tests.engine.test_servicer import one, stub
from tests.engine.test_session import read_until_ended

pytestmark = pytest.mark.asyncio
__all__ = ["stub"]  # the fixture, imported to be used here

TOKENIZER = SimTokenizer()
USER = c.CHAT_ROLE_USER
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": ["string", "null"], "enum": ["c", "f", None]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "hours": {"type": "array", "items": {"type": "number"}, "maxItems": 4},
        "where": {"$ref": "#/$defs/place"},
    },
    "required": ["city", "unit", "days", "hours", "where"],
    "additionalProperties": False,
    "$defs": {
        "place": {
            "anyOf": [
                {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]},
                {"type": "boolean"},
            ]
        }
    },
}
WEATHER = c.ToolDefinition(name="get_weather", parameters_json=json.dumps(WEATHER_SCHEMA))
CLOCK = c.ToolDefinition(name="get_time")
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "get_time": {"type": "object", "additionalProperties": False}}
NAMED = c.ToolChoice(mode=c.TOOL_CHOICE_MODE_NAMED, name="get_weather")
REQUIRED = c.ToolChoice(mode=c.TOOL_CHOICE_MODE_REQUIRED)


@dataclass
class Reply:
    """What one Generate call streamed."""

    deltas: list[pb.TokenDelta] = field(default_factory=list)
    finished: pb.GenerateFinished | None = None

    @property
    def token_ids(self) -> list[int]:
        return [token for delta in self.deltas for token in delta.token_ids]

    @property
    def text(self) -> str:
        return "".join(delta.text for delta in self.deltas)

    @property
    def parts(self) -> list[c.ToolCallDelta]:
        return [part for delta in self.deltas for part in delta.tool_calls]

    @property
    def reason(self) -> int:
        assert self.finished is not None
        return self.finished.reason


def calls(parts: list[c.ToolCallDelta]) -> list[tuple[str, str]]:
    """(name, arguments) of each call, checking that only a call's first
    part carries its id and name."""
    merged: dict[int, list[str]] = {}
    for part in parts:
        if part.index not in merged:
            assert part.index == len(merged) and part.id and part.name
            merged[part.index] = [part.name, part.arguments]
        else:
            assert not part.id and not part.name
            merged[part.index][1] += part.arguments
    return [(name, arguments) for name, arguments in merged.values()]


def start(
    content: str = "tell me about the sea", request_id: str = "req-1", **sampling: object
) -> pb.GenerateStart:
    return pb.GenerateStart(
        request_id=request_id,
        messages=[c.ChatMessage(role=USER, content=content)],
        sampling=c.SamplingParams(**sampling),  # type: ignore[arg-type]
    )


async def generate(stub: pb_grpc.EngineServiceAsyncStub, message: pb.GenerateStart) -> Reply:
    reply = Reply()
    async for response in stub.Generate(one(pb.GenerateRequest(start=message))):
        if response.HasField("delta"):
            reply.deltas.append(response.delta)
        elif response.HasField("finished"):
            reply.finished = response.finished
    return reply


async def test_logprobs_come_one_per_token_with_the_likeliest_alternatives(
    stub: pb_grpc.EngineServiceAsyncStub,
) -> None:
    reply = await generate(stub, start(max_tokens=12, temperature=0.8, seed=5, logprobs=True, top_logprobs=3))
    entries = [entry for delta in reply.deltas for entry in delta.logprobs]
    assert [entry.token_id for entry in entries] == reply.token_ids
    for entry in entries:
        assert entry.token == TOKENIZER.decode([entry.token_id]) and entry.token_bytes == entry.token.encode()
        assert entry.logprob <= 0 and len(entry.top) == 3
        assert [top.logprob for top in entry.top] == sorted((top.logprob for top in entry.top), reverse=True)
        assert entry.logprob <= entry.top[0].logprob
        listed = {top.token_id: top.logprob for top in entry.top}
        if entry.token_id in listed:
            assert listed[entry.token_id] == entry.logprob
    plain = await generate(stub, start(max_tokens=12, temperature=0.8, seed=5))
    assert plain.token_ids == reply.token_ids, "asking for logprobs changes nothing else"
    assert all(not delta.logprobs for delta in plain.deltas)


async def test_logit_bias_bans_and_favours_tokens(stub: pb_grpc.EngineServiceAsyncStub) -> None:
    base = await generate(stub, start(max_tokens=40, ignore_eos=True))
    common, _ = Counter(base.token_ids).most_common(1)[0]
    banned = await generate(stub, start(max_tokens=40, ignore_eos=True, logit_bias={common: -100.0}))
    assert common not in banned.token_ids
    sea = TOKENIZER.piece_id(" sea")  # a word outside the greedy pool
    assert sea not in base.token_ids
    favoured = await generate(stub, start(max_tokens=10, logit_bias={sea: 100.0}))
    assert favoured.token_ids == [sea] * 10 and favoured.text == " sea" * 10
    nudged = await generate(stub, start(max_tokens=40, ignore_eos=True, logit_bias={sea: 1.0}))
    assert sea not in nudged.token_ids, "a small bias leaves a token outside the pool rare"


async def test_penalties_change_repetition(stub: pb_grpc.EngineServiceAsyncStub) -> None:
    marks = {TOKENIZER.piece_id("."), TOKENIZER.piece_id(",")}

    def repeats(reply: Reply) -> int:
        words = [token for token in reply.token_ids if token not in marks]
        return len(words) - len(set(words))

    plain = await generate(stub, start(max_tokens=50, ignore_eos=True))
    presence = await generate(stub, start(max_tokens=50, ignore_eos=True, presence_penalty=2.0))
    frequency = await generate(stub, start(max_tokens=50, ignore_eos=True, frequency_penalty=1.5))
    attracted = await generate(stub, start(max_tokens=50, ignore_eos=True, presence_penalty=-2.0))
    assert repeats(plain) > 0
    assert repeats(presence) == 0 and repeats(frequency) == 0
    assert repeats(attracted) > repeats(plain)


async def test_json_schema_replies_are_valid_instances(stub: pb_grpc.EngineServiceAsyncStub) -> None:
    response_format = c.ResponseFormat(
        type=c.RESPONSE_FORMAT_TYPE_JSON_SCHEMA, schema_name="weather", schema_json=json.dumps(WEATHER_SCHEMA)
    )
    texts = set()
    for seed in range(8):
        reply = await generate(stub, start(temperature=1.0, seed=seed, response_format=response_format))
        assert reply.reason == c.FINISH_REASON_STOP and not reply.parts
        jsonschema.validate(json.loads(reply.text), WEATHER_SCHEMA)
        texts.add(reply.text)
    assert len(texts) > 1, "the seed shapes the document"
    again = await generate(stub, start(temperature=1.0, seed=0, response_format=response_format))
    first = await generate(stub, start(temperature=1.0, seed=0, response_format=response_format))
    assert again.text == first.text


async def test_json_object_replies_are_objects(stub: pb_grpc.EngineServiceAsyncStub) -> None:
    response_format = c.ResponseFormat(type=c.RESPONSE_FORMAT_TYPE_JSON_OBJECT)
    reply = await generate(stub, start(response_format=response_format))
    assert isinstance(json.loads(reply.text), dict) and reply.reason == c.FINISH_REASON_STOP


async def test_a_named_tool_choice_calls_that_tool(stub: pb_grpc.EngineServiceAsyncStub) -> None:
    reply = await generate(stub, start(tools=[WEATHER, CLOCK], tool_choice=NAMED, logprobs=True))
    assert reply.reason == c.FINISH_REASON_TOOL_CALLS and reply.text == ""
    ((name, arguments),) = calls(reply.parts)
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments), WEATHER_SCHEMA)
    assert reply.finished is not None and reply.finished.usage.output_tokens == len(reply.token_ids)
    assert TOKENIZER.decode(reply.token_ids) == arguments, "the call's tokens are real output tokens"
    assert sum(len(delta.logprobs) for delta in reply.deltas) == len(reply.token_ids)


async def test_a_required_tool_choice_calls_tools_in_the_array_format(
    stub: pb_grpc.EngineServiceAsyncStub,
) -> None:
    counts = set()
    for seed in range(12):
        reply = await generate(
            stub, start(tools=[WEATHER, CLOCK], tool_choice=REQUIRED, temperature=1.0, seed=seed)
        )
        made = calls(reply.parts)
        assert reply.reason == c.FINISH_REASON_TOOL_CALLS and made
        assert json.loads(TOKENIZER.decode(reply.token_ids)) == [
            {"name": name, "arguments": json.loads(arguments)} for name, arguments in made
        ]
        for name, arguments in made:
            jsonschema.validate(json.loads(arguments), SCHEMAS[name])
        counts.add(len(made))
        single = await generate(
            stub,
            start(
                tools=[WEATHER, CLOCK],
                tool_choice=REQUIRED,
                temperature=1.0,
                seed=seed,
                parallel_tool_calls=False,
            ),
        )
        assert len(calls(single.parts)) == 1
    assert max(counts) > 1, "parallel calls happen"


async def test_auto_calls_the_tools_the_user_names_and_otherwise_answers(
    stub: pb_grpc.EngineServiceAsyncStub,
) -> None:
    named = await generate(stub, start("use get_time and get_weather please", tools=[WEATHER, CLOCK]))
    assert [name for name, _ in calls(named.parts)] == ["get_weather", "get_time"]
    assert named.reason == c.FINISH_REASON_TOOL_CALLS
    one_call = await generate(
        stub, start("use get_time and get_weather please", tools=[WEATHER, CLOCK], parallel_tool_calls=False)
    )
    assert [name for name, _ in calls(one_call.parts)] == ["get_weather"]
    text = await generate(stub, start("what is the weather like?", tools=[WEATHER, CLOCK]))
    assert text.reason == c.FINISH_REASON_STOP and text.text and not text.parts
    refused = await generate(
        stub,
        start(
            "use get_weather",
            tools=[WEATHER],
            tool_choice=c.ToolChoice(mode=c.TOOL_CHOICE_MODE_NONE),
        ),
    )
    assert refused.text and not refused.parts


async def test_a_tool_result_is_answered_in_text(stub: pb_grpc.EngineServiceAsyncStub) -> None:
    prompt = TOKENIZER.render_chat(
        [("user", "use get_time"), ("assistant", '{"tool_call": {"name": "get_time"}}'), ("tool", "noon")],
        True,
    )
    reply = await generate(
        stub,
        pb.GenerateStart(request_id="r", prompt_token_ids=prompt, sampling=c.SamplingParams(tools=[CLOCK])),
    )
    assert reply.text and not reply.parts and reply.reason == c.FINISH_REASON_STOP


async def test_max_tokens_cuts_a_tool_call_with_length(stub: pb_grpc.EngineServiceAsyncStub) -> None:
    whole = await generate(stub, start(tools=[WEATHER], tool_choice=NAMED))
    cut = await generate(stub, start(tools=[WEATHER], tool_choice=NAMED, max_tokens=7))
    assert cut.reason == c.FINISH_REASON_LENGTH and len(cut.token_ids) == 7
    assert cut.finished is not None and cut.finished.usage.output_tokens == 7
    ((_, arguments),) = calls(cut.parts)
    ((_, full),) = calls(whole.parts)
    assert full.startswith(arguments) and len(arguments) < len(full)


@pytest.mark.parametrize(
    "sampling",
    [
        {"tools": [WEATHER, CLOCK], "tool_choice": REQUIRED, "temperature": 1.0, "seed": 4},
        {"tools": [WEATHER], "tool_choice": NAMED},
    ],
)
async def test_a_continuation_mid_tool_call_goes_on_as_the_unbroken_reply(
    stub: pb_grpc.EngineServiceAsyncStub, sampling: dict[str, Any]
) -> None:
    whole = await generate(stub, start(**sampling))
    tokens = whole.token_ids
    for cut in (1, 5, len(tokens) // 2, len(tokens) - 1):
        before = [delta for delta in whole.deltas if delta.output_token_offset < cut]
        message = start(**sampling)
        message.resume_output_token_ids.extend(tokens[:cut])
        rest = await generate(stub, message)
        assert [t for d in before for t in d.token_ids] + rest.token_ids == tokens
        parts = [part for delta in before for part in delta.tool_calls] + rest.parts
        assert calls(parts) == calls(whole.parts)
        assert rest.reason == c.FINISH_REASON_TOOL_CALLS


async def test_a_continuation_that_is_not_the_guided_reply_is_refused(
    stub: pb_grpc.EngineServiceAsyncStub,
) -> None:
    message = start(tools=[WEATHER], tool_choice=NAMED)
    message.resume_output_token_ids.extend(TOKENIZER.encode("hello"))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await generate(stub, message)
    error = from_rpc_error(raised.value)
    assert (error.reason, error.metadata.get("param")) == ("INVALID_REQUEST", "resume_output_token_ids")


async def test_generate_session_carries_tool_calls_and_logprobs(stub: pb_grpc.EngineServiceAsyncStub) -> None:
    whole = await generate(stub, start(tools=[WEATHER], tool_choice=NAMED, logprobs=True, top_logprobs=1))

    call = stub.GenerateSession()
    await call.write(
        pb.GenerateSessionRequest(
            start=start(tools=[WEATHER], tool_choice=NAMED, logprobs=True, top_logprobs=1)
        )
    )
    events = [event for message in await read_until_ended(call, {"req-1"}) for event in message.events]
    call.cancel()
    deltas = [event.delta for event in events if event.HasField("delta")]
    finished = events[-1].finished if events[-1].HasField("finished") else None
    assert finished is not None and finished.reason == c.FINISH_REASON_TOOL_CALLS
    assert calls([part for delta in deltas for part in delta.tool_calls]) == calls(whole.parts)
    assert [entry for delta in deltas for entry in delta.logprobs] == [
        entry for delta in whole.deltas for entry in delta.logprobs
    ]


async def test_a_continuation_with_penalties_and_logprobs_goes_on_as_the_unbroken_reply(
    stub: pb_grpc.EngineServiceAsyncStub,
) -> None:
    """Penalties make a token depend on the output before it; a continuation
    has that output (its resumed tokens), so it goes on exactly."""
    sea = TOKENIZER.piece_id(" sea")
    sampling: dict[str, Any] = {
        "max_tokens": 40,
        "ignore_eos": True,
        "temperature": 0.9,
        "seed": 11,
        "presence_penalty": 1.0,
        "frequency_penalty": 0.5,
        "logit_bias": {sea: 8.0},
        "logprobs": True,
        "top_logprobs": 2,
    }
    whole = await generate(stub, start(**sampling))
    for cut in (1, 17, 39):
        message = start(**sampling)
        message.resume_output_token_ids.extend(whole.token_ids[:cut])
        rest = await generate(stub, message)
        assert rest.token_ids == whole.token_ids[cut:]
        after = [
            entry for delta in whole.deltas if delta.output_token_offset >= cut for entry in delta.logprobs
        ]
        assert [entry for delta in rest.deltas for entry in delta.logprobs] == after
