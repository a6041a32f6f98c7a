"""Request bodies nested deeper than any OpenAI request are a 400 on every
JSON route, never a RecursionError's 500."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.json_body import MAX_DEPTH, nesting_depth, parse_json
from tests.stack import DEV_KEY

AUTH = {"authorization": f"Bearer {DEV_KEY}", "content-type": "application/json"}
HELLO = [{"role": "user", "content": "Hello"}]


def depth_of(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


# Text full of the characters the scan must see past: brackets and quotes in strings, escapes.
TRICKY_TEXT = st.text(alphabet=st.sampled_from('[]{}"\\ab\u00e9\U0001f600\n'))


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | TRICKY_TEXT,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY_TEXT, inner, max_size=3),
        max_leaves=30,
    ),
    st.sampled_from(["utf-8", "utf-16", "utf-32"]),
)
def test_the_depth_scan_agrees_with_the_decoder(value: object, encoding: str) -> None:
    raw = json.dumps(value, ensure_ascii=False).encode("utf-8")
    assert nesting_depth(raw) == depth_of(value)
    # Other encodings JSON allows decode to the same value.
    assert parse_json(json.dumps(value, ensure_ascii=False).encode(encoding)) == value


def nested(levels: int, inner: str = "1") -> str:
    return "[" * levels + inner + "]" * levels


def test_the_deepest_allowed_body_parses_and_one_level_more_is_refused() -> None:
    assert depth_of(parse_json(nested(MAX_DEPTH).encode())) == MAX_DEPTH
    with pytest.raises(OpenAIError) as deeper:
        parse_json(nested(MAX_DEPTH + 1).encode())
    assert (deeper.value.status, deeper.value.code) == (400, "invalid_json")


@pytest.mark.asyncio
async def test_deep_nesting_is_a_400_on_every_json_route(http: httpx.AsyncClient) -> None:
    created = await http.post("/v1/conversations", json={}, headers=AUTH)
    assert created.status_code == 200, created.text
    deep = nested(5_000)
    bodies = {
        "/v1/chat/completions": f'{{"model": "auto", "messages": {json.dumps(HELLO)}, "metadata": {deep}}}',
        "/v1/conversations": f'{{"title": {deep}}}',
        f"/v1/conversations/{created.json()['id']}/messages": f'{{"content": {deep}}}',
    }
    for path, body in bodies.items():
        resp = await http.post(path, content=body.encode(), headers=AUTH)
        assert resp.status_code == 400, (path, resp.text)
        error = resp.json()["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_json"), path
