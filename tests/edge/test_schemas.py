"""OpenAI request validation names the offending parameter."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.schemas import parse_chat_request
from llmmesh.v1 import common_pb2

OK = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}


def test_a_valid_request_translates_to_the_contract() -> None:
    req = parse_chat_request(
        {**OK, "max_completion_tokens": 9, "max_tokens": 3, "stop": "END", "seed": 4, "temperature": 0}
    )
    sampling = req.to_sampling()
    assert sampling.max_tokens == 9  # max_completion_tokens wins, as in OpenAI's API
    assert list(sampling.stop) == ["END"]
    assert sampling.seed == 4
    assert sampling.HasField("temperature")
    (message,) = req.to_messages()
    assert message.role == common_pb2.CHAT_ROLE_USER


def test_multi_part_text_content_is_joined() -> None:
    req = parse_chat_request(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
            ],
        }
    )
    assert req.to_messages()[0].content == "ab"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": OK["messages"]}, "model"),
        ({"model": "auto"}, "messages"),
        ({"model": "auto", "messages": []}, "messages"),
        ({**OK, "messages": [{"content": "hi"}]}, "messages[0].role"),
        ({**OK, "top_p": 0}, "top_p"),
        ({**OK, "n": 2}, "n"),
        ({**OK, "stream": "yes"}, "stream"),
        ({**OK, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ],
)
def test_invalid_requests_name_the_param(body: dict[str, object], param: str) -> None:
    with pytest.raises(OpenAIError) as info:
        parse_chat_request(body)
    assert info.value.status == 400
    assert info.value.param == param


def test_non_positive_max_tokens_is_refused() -> None:
    with pytest.raises(OpenAIError) as info:
        parse_chat_request({**OK, "max_tokens": -1}).to_sampling()
    assert info.value.param == "max_tokens"


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
    )
)
def test_arbitrary_json_never_escapes_as_anything_but_a_400(body: object) -> None:
    status = 200
    try:
        parse_chat_request(body).to_sampling()
    except OpenAIError as err:
        status = err.status
    assert status in (200, 400)


def test_ignore_eos_reaches_the_sampling_parameters() -> None:
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}
    assert parse_chat_request(body).to_sampling().ignore_eos is True
    assert parse_chat_request({**body, "ignore_eos": False}).to_sampling().ignore_eos is False
    with pytest.raises(OpenAIError) as err:
        parse_chat_request({**body, "ignore_eos": "yes"})
    assert err.value.param == "ignore_eos"


def test_a_reply_echoed_back_with_its_empty_fields_is_accepted() -> None:
    """``messages.append(reply.model_dump())`` sends every field of the
    reply, null or empty: none of them is an error, nor an empty metadata."""
    echoed: dict[str, object] = {
        "role": "assistant",
        "content": "Hello!",
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": None,
    }
    body = {"model": "auto", "metadata": {}, "messages": [{"role": "user", "content": "Hi"}, echoed]}
    request = parse_chat_request(body)
    request.check_supported()
    assert [m.content for m in request.to_messages()] == ["Hi", "Hello!"]
    echoed["annotations"] = []
    assert len(parse_chat_request(body).to_messages()) == 2


@pytest.mark.parametrize(
    ("message", "param", "code"),
    [
        (
            {"role": "assistant", "content": "x", "annotations": [{"type": "url_citation"}]},
            "annotations",
            "unsupported_parameter",
        ),
        (
            {"role": "user", "content": "x", "annotations": [{"type": "url_citation"}]},
            "annotations",
            "unknown_parameter",
        ),
    ],
)
def test_annotations_with_content_are_refused_naming_them(
    message: dict[str, object], param: str, code: str
) -> None:
    with pytest.raises(OpenAIError) as refused:
        parse_chat_request({"model": "auto", "messages": [message]}).to_messages()
    assert (refused.value.param, refused.value.code) == (f"messages[0].{param}", code)
