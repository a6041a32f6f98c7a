"""The simulator's tokenizer: exact round trips, stable ids, chat template."""

from __future__ import annotations

import os
import subprocess
import sys
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmmesh.core.chat_tokenizer import (
    CACHED_CONTENT_CHARS,
    CACHED_CONTENT_MAX_CHARS,
    CONTENT_CACHE_ENTRIES,
    PieceTokenizer,
    PieceTokenizerSpec,
    tokenizer_response,
    tokenizer_spec,
)
from llmmesh.engine.sim.tokenizer import SimTokenizer
from llmmesh.engine.sim.vocabulary import SPECIAL_TOKENS, VOCAB_SIZE, WORDS

TOKENIZER = SimTokenizer()
valid_text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=200)
word_text = st.lists(st.sampled_from([*WORDS, ",", ".", "\n", "Hello", "2024"]), max_size=40).map(" ".join)


@given(valid_text)
def test_decode_inverts_encode(text: str) -> None:
    assert TOKENIZER.decode(TOKENIZER.encode(text)) == text


@given(valid_text)
def test_ids_stay_inside_the_vocabulary(text: str) -> None:
    assert all(0 <= token_id < VOCAB_SIZE for token_id in TOKENIZER.encode(text))


@given(word_text)
def test_encoding_is_deterministic_and_concatenates_at_spaces(text: str) -> None:
    assert TOKENIZER.encode(text) == SimTokenizer().encode(text)
    assert TOKENIZER.encode(text + " the") == [*TOKENIZER.encode(text), TOKENIZER.piece_id(" the")]


def test_vocabulary_words_are_single_tokens() -> None:
    assert TOKENIZER.encode("the quick answer") == [
        TOKENIZER.piece_id("the"),
        TOKENIZER.piece_id(" quick"),
        TOKENIZER.piece_id(" answer"),
    ]


def test_ids_are_the_same_in_another_process() -> None:
    # A different hash seed proves no id comes from Python's hash().
    text = "Hello, the zebra ate 42 figs über alles."
    script = f"from engine.sim.tokenizer import SimTokenizer;print(SimTokenizer().encode({text!r}))"
    other = subprocess.run(
        [sys.executable, "-c", script],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "123"},
    )
    assert other.stdout.strip() == str(TOKENIZER.encode(text))


def test_chat_template_marks_roles_and_generation_prompt() -> None:
    ids = TOKENIZER.render_chat([("system", "be brief"), ("user", "hello")], add_generation_prompt=True)
    assert TOKENIZER.decode(ids) == "<s><|system|>be brief<|end|><|user|>hello<|end|><|assistant|>"
    without = TOKENIZER.render_chat([("system", "be brief"), ("user", "hello")], add_generation_prompt=False)
    assert ids == [*without, SPECIAL_TOKENS.index("<|assistant|>")]
    assert TOKENIZER.decode(ids, skip_special_tokens=True) == "be briefhello"


def test_unknown_role_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown chat role"):
        TOKENIZER.render_chat([("wizard", "hi")], add_generation_prompt=True)


def test_decode_rejects_ids_outside_the_vocabulary() -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        TOKENIZER.decode([VOCAB_SIZE])


PUBLISHED = tokenizer_spec(tokenizer_response("llmmesh-tiny", TOKENIZER.spec))
roles = st.sampled_from(["system", "user", "assistant", "developer", "tool"])


@given(st.lists(st.tuples(roles, valid_text), max_size=5), st.booleans())
def test_the_published_spec_renders_chats_as_the_simulator_does(
    turns: list[tuple[str, str]], add_generation_prompt: bool
) -> None:
    assert isinstance(PUBLISHED, PieceTokenizerSpec)
    assert PieceTokenizer(PUBLISHED).render_chat(turns, add_generation_prompt) == TOKENIZER.render_chat(
        turns, add_generation_prompt
    )


def test_a_message_sent_again_renders_from_the_cache_to_the_same_ids() -> None:
    """A long message's ids are kept and reused, the oldest going first past
    the cache's size; a short one is encoded every time."""
    assert isinstance(PUBLISHED, PieceTokenizerSpec)
    tokenizer = PieceTokenizer(PUBLISHED)
    system = " ".join(WORDS[i % len(WORDS)] for i in range(CACHED_CONTENT_CHARS // 3))
    assert CACHED_CONTENT_CHARS <= len(system) <= CACHED_CONTENT_MAX_CHARS

    def chat(user: str) -> list[int]:
        return tokenizer.render_chat([("system", system), ("user", user)], True)

    first = chat("hello")
    assert first == [
        TOKENIZER.spec.bos_id,
        TOKENIZER.spec.role_ids["system"],
        *tokenizer.encode(system),
        TOKENIZER.spec.end_of_turn_id,
        TOKENIZER.spec.role_ids["user"],
        *tokenizer.encode("hello"),
        TOKENIZER.spec.end_of_turn_id,
        TOKENIZER.spec.role_ids["assistant"],
    ]
    first.clear()  # what a caller does with its ids is not the cache's
    with mock.patch.object(tokenizer, "encode", wraps=tokenizer.encode) as encode:
        again = chat("hello again")
        assert again == TOKENIZER.render_chat([("system", system), ("user", "hello again")], True)
        assert [c.args[0] for c in encode.call_args_list] == ["hello again"]  # the system prompt came cached
        # Past the cache's size the oldest content goes; encoding it again gives the same ids.
        for index in range(CONTENT_CACHE_ENTRIES):
            tokenizer.render_chat([("user", f"{index} {system}")], False)
        encode.reset_mock()
        assert chat("hello again") == again
        assert [c.args[0] for c in encode.call_args_list] == [system, "hello again"]
