"""Tool-call fragments, log probabilities and finish reasons in OpenAI's
shapes, streamed and whole, parsed back by the official SDK's types."""

from __future__ import annotations

import json

from openai.types.chat import ChatCompletion, ChatCompletionChunk

from llmmesh.edge.chunks import ChunkStream, completion_object
from llmmesh.edge.reply_parts import ReplyCollector
from llmmesh.v1 import chat_service_pb2, common_pb2

USAGE = common_pb2.TokenUsage(input_tokens=7, output_tokens=4)


def call_deltas() -> list[chat_service_pb2.ChatDelta]:
    """A reply of two tool calls, the first in two parts."""
    return [
        chat_service_pb2.ChatDelta(
            sequence=1,
            token_ids=[1, 2],
            tool_calls=[common_pb2.ToolCallDelta(index=0, id="call_a", name="get_weather", arguments='{"ci')],
        ),
        chat_service_pb2.ChatDelta(
            sequence=2,
            token_ids=[3],
            tool_calls=[
                common_pb2.ToolCallDelta(index=0, arguments='ty":"Oslo"}'),
                common_pb2.ToolCallDelta(index=1, id="call_b", name="get_time", arguments="{}"),
            ],
        ),
    ]


def payload(frame: bytes) -> dict[str, object]:
    data = frame.decode().split("data: ", 1)[1].strip()
    decoded = json.loads(data)
    assert isinstance(decoded, dict)
    return decoded


def test_streamed_tool_calls_are_openai_fragments() -> None:
    stream = ChunkStream("chatcmpl-1", 1, "m", include_usage=False)
    first, second = (
        ChatCompletionChunk.model_validate(payload(stream.delta(d).frame)) for d in call_deltas()
    )
    (head,) = first.choices[0].delta.tool_calls or []
    assert (head.index, head.id, head.type) == (0, "call_a", "function")
    assert head.function is not None and (head.function.name, head.function.arguments) == (
        "get_weather",
        '{"ci',
    )
    assert first.choices[0].delta.content is None
    more, other = second.choices[0].delta.tool_calls or []
    assert more.id is None and more.function is not None and more.function.name is None
    assert more.function.arguments == 'ty":"Oslo"}'
    assert (other.index, other.id) == (1, "call_b")
    finish = ChatCompletionChunk.model_validate(
        payload(stream.finish(common_pb2.FINISH_REASON_TOOL_CALLS).frame)
    )
    assert finish.choices[0].finish_reason == "tool_calls"


def test_a_plain_delta_keeps_the_plain_content_chunk() -> None:
    stream = ChunkStream("chatcmpl-1", 1, "m", include_usage=False)
    delta = chat_service_pb2.ChatDelta(sequence=1, text="Hi", token_ids=[5])
    assert stream.delta(delta).frame == ChunkStream("chatcmpl-1", 1, "m", False).content(1, "Hi").frame


def test_streamed_logprobs() -> None:
    stream = ChunkStream("chatcmpl-1", 1, "m", include_usage=False)
    entry = common_pb2.TokenLogprob(
        token_id=5,
        token="Hi",
        logprob=-0.25,
        token_bytes=b"Hi",
        top=[common_pb2.TopLogprob(token_id=5, token="Hi", logprob=-0.25, token_bytes=b"Hi")],
    )
    delta = chat_service_pb2.ChatDelta(sequence=1, text="Hi", token_ids=[5], logprobs=[entry])
    chunk = ChatCompletionChunk.model_validate(payload(stream.delta(delta).frame))
    logprobs = chunk.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    (token,) = logprobs.content
    assert (token.token, token.logprob, token.bytes) == ("Hi", -0.25, [72, 105])
    assert [t.token for t in token.top_logprobs] == ["Hi"]
    assert chunk.choices[0].delta.content == "Hi"


def test_a_cancelled_stream_finishes_with_its_own_reason_and_the_billed_usage() -> None:
    plain = payload(
        ChunkStream("c", 1, "m", include_usage=False)
        .finish(common_pb2.FINISH_REASON_CANCELLED, (), USAGE)
        .frame
    )
    assert plain["choices"][0]["finish_reason"] == "cancelled"  # type: ignore[index]
    assert plain["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 4,
        "total_tokens": 11,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    # With include_usage the usage chunk follows, as for any stream.
    asked = payload(
        ChunkStream("c", 1, "m", include_usage=True)
        .finish(common_pb2.FINISH_REASON_CANCELLED, (), USAGE)
        .frame
    )
    assert asked["usage"] is None
    stopped = payload(
        ChunkStream("c", 1, "m", include_usage=False).finish(common_pb2.FINISH_REASON_STOP, (), USAGE).frame
    )
    assert stopped["choices"][0]["finish_reason"] == "stop" and "usage" not in stopped  # type: ignore[index]


def test_a_whole_completion_of_tool_calls_has_null_content() -> None:
    reply = ReplyCollector()
    for delta in call_deltas():
        reply.add(delta)
    body = completion_object("chatcmpl-1", 1, "m", reply, common_pb2.FINISH_REASON_TOOL_CALLS, USAGE)
    completion = ChatCompletion.model_validate(body)
    message = completion.choices[0].message
    assert message.content is None and completion.choices[0].finish_reason == "tool_calls"
    calls = message.tool_calls or []
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
        ("call_a", "get_weather", '{"city":"Oslo"}'),
        ("call_b", "get_time", "{}"),
    ]
    assert completion.choices[0].logprobs is None


def test_a_whole_completion_with_logprobs_has_one_per_token() -> None:
    reply = ReplyCollector()
    for n, text in enumerate(["Hel", "lo"]):
        entry = common_pb2.TokenLogprob(token_id=n, token=text, logprob=-1.0, token_bytes=text.encode())
        reply.add(chat_service_pb2.ChatDelta(sequence=n + 1, text=text, token_ids=[n], logprobs=[entry]))
    body = completion_object("c", 1, "m", reply, common_pb2.FINISH_REASON_STOP, USAGE, logprobs=True)
    completion = ChatCompletion.model_validate(body)
    assert completion.choices[0].message.content == "Hello"
    assert completion.choices[0].message.tool_calls is None
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and [t.token for t in logprobs.content or []] == ["Hel", "lo"]
