"""Content chunks framed from a template are byte for byte what encoding the
whole chunk gives: one ``data:`` line, as OpenAI frames it (an opted-in
client's ``id:`` line is added as the frame is sent)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from llmmesh.edge.chunks import ChunkStream, sse_data


def whole_chunk(stream: ChunkStream, text: str) -> dict[str, object]:
    chunk: dict[str, object] = {
        "id": stream.completion_id,
        "object": "chat.completion.chunk",
        "created": stream.created,
        "model": stream.model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}],
    }
    if stream.include_usage:
        chunk["usage"] = None
    return chunk


@given(
    text=st.text(),
    model=st.text(min_size=1, max_size=40),
    include_usage=st.booleans(),
    sequence=st.integers(min_value=1, max_value=10**9),
)
def test_a_content_chunk_is_the_whole_chunk_encoded(
    text: str, model: str, include_usage: bool, sequence: int
) -> None:
    stream = ChunkStream("chatcmpl-abc", 1_700_000_000, model, include_usage)
    event = stream.content(sequence, text)
    assert event.event_id == sequence
    assert event.frame == sse_data(whole_chunk(stream, text))
    payload = json.loads(event.frame.decode().split("data: ", 1)[1])
    assert payload["choices"][0]["delta"]["content"] == text


def test_a_model_name_holding_the_marker_changes_nothing() -> None:
    stream = ChunkStream("chatcmpl-abc", 1, "odd\x00model", True)
    event = stream.content(3, "hi\x00")
    assert event.frame == sse_data(whole_chunk(stream, "hi\x00"))


def test_content_ids_stay_above_the_last_one() -> None:
    stream = ChunkStream("chatcmpl-abc", 1, "m", False)
    stream.role()
    assert [stream.content(s, "x").event_id for s in (1, 1, 5, 3)] == [1, 2, 5, 6]
