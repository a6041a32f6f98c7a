"""The one-shot endpoints' shared request checks and answer headers."""

from __future__ import annotations

import pytest

from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.unary_requests import answer_headers, object_of_fields
from llmmesh.v1 import chat_service_pb2


def test_a_body_of_known_fields_is_returned_as_is() -> None:
    body: object = {"input": "x", "model": "m"}
    assert object_of_fields(body, frozenset({"input", "model", "user"})) is body


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ([1, 2], "", "invalid_type"),
        ("text", "", "invalid_type"),
        ({"input": "x", "extra": 1}, "extra", "unknown_parameter"),
    ],
)
def test_other_bodies_are_400s_naming_the_field(body: object, param: str, code: str) -> None:
    with pytest.raises(OpenAIError) as refused:
        object_of_fields(body, frozenset({"input"}))
    assert refused.value.status == 400
    assert (refused.value.param, refused.value.code) == (param, code)


def test_answer_headers_name_the_request_the_region_and_its_limits() -> None:
    limits = chat_service_pb2.RateLimitStatus(limit_requests=10, remaining_requests=9)
    headers = answer_headers("emb-1", "eu-west", limits)
    assert headers["x-request-id"] == "emb-1" and headers["x-llmmesh-region"] == "eu-west"
    assert headers["x-ratelimit-limit-requests"] == "10"
    assert headers["x-ratelimit-remaining-requests"] == "9"
    assert not any(name.endswith("-tokens") for name in headers)
