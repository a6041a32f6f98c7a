"""Prompt tokenization for the simulator: its own word pieces, or the
tokenizer of the model it simulates.

A simulator pod given a Hugging Face model directory (``model_path`` with a
``tokenizer.json`` and a chat template) tokenizes prompts exactly as a vLLM
pod serving that model does: it renders chats with the model's template
through transformers and encodes the text without adding special tokens a
second time, and publishes the same :class:`HfTokenizerSpec`
(``GetTokenizer``). The region therefore sends it the model's own prompt
ids, and everything that follows from them is the model's: the
``prompt_tokens`` and ``cached_prompt_tokens`` it reports (and the mesh
bills), the prefill cost of the timing model, and the KV blocks it hashes
and announces, which are the blocks the region's router hashes from the
same ids. Output is still the simulator's own word pieces, one per decode
step and one per counted output token (their ids lie below the reported
vocabulary size, the larger of the two). For the free text it writes that
is close to the model's own count (each spaced word is one token of the
project's BPE models; a capitalised sentence start is two), while guided
JSON, written in bare words and punctuation, counts fewer pieces than the
model would tokens.

Without a model directory the pod tokenizes with its word pieces
(:class:`engine.sim.tokenizer.SimTokenizer`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from llmmesh.core.chat_tokenizer import TokenizerSpec
from llmmesh.engine.vllm_engine.tokenizer_spec import hf_tokenizer_spec

# Marks where a probe message's content lies in a rendered chat.
_PROBE = "\u2063probe\u2063"


class PromptTokenizer(Protocol):
    """How a simulator pod turns prompts into ids and reads them back."""

    vocab_size: int

    @property
    def spec(self) -> TokenizerSpec:
        """What the pod publishes, so a region tokenizes alike."""
        ...

    def encode_prompt(self, text: str) -> list[int]:
        """A plain-text prompt's ids."""
        ...

    def render_chat(self, turns: Iterable[tuple[str, str]], add_generation_prompt: bool) -> list[int]:
        """Chat turns ``(role, content)`` as ids; ValueError for a chat it cannot render."""
        ...

    def last_user_message(self, prompt_token_ids: Sequence[int]) -> str | None:
        """The text of the prompt's last user message (the whole text of a
        prompt that is not a chat), None when a tool message follows it."""
        ...


class ModelPromptTokenizer:
    """The prompt tokenizer of a Hugging Face model directory; see the module docstring."""

    def __init__(self, model_dir: Path) -> None:
        """Raises ValueError for a directory without a tokenizer and chat
        template that data alone reproduces, ImportError without transformers."""
        if not (model_dir / "tokenizer.json").is_file():
            raise ValueError(f"no tokenizer.json in {model_dir}: the simulator needs a fast tokenizer")
        # Loading a local tokenizer must not reach for the network.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer

        self._tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir))
        spec = hf_tokenizer_spec(self._tokenizer)
        if spec is None:
            raise ValueError(f"the tokenizer in {model_dir} has no single chat template to publish")
        self._spec = spec
        self.vocab_size: int = len(self._tokenizer)
        self._user_opener, self._user_closer = self._role_markers("user")
        self._tool_opener = self._role_markers("tool")[0]

    @property
    def spec(self) -> TokenizerSpec:
        return self._spec

    def encode_prompt(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text)
        return ids

    def render_chat(self, turns: Iterable[tuple[str, str]], add_generation_prompt: bool) -> list[int]:
        text = self._render(
            [{"role": role, "content": content} for role, content in turns], add_generation_prompt
        )
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False)
        return ids

    def last_user_message(self, prompt_token_ids: Sequence[int]) -> str | None:
        text: str = self._tokenizer.decode(list(prompt_token_ids), skip_special_tokens=False)
        if not self._user_opener:
            return text
        start = text.rfind(self._user_opener)
        if start < 0:
            return text
        text = text[start + len(self._user_opener) :]
        end = text.find(self._user_closer) if self._user_closer else -1
        if end < 0:
            return text
        if self._tool_opener and self._tool_opener in text[end:]:
            return None
        return text[:end]

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        try:
            text: str = self._tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, tokenize=False
            )
        except Exception as exc:  # jinja raises its own errors for a chat it refuses
            raise ValueError(str(exc)) from exc
        return text

    def _role_markers(self, role: str) -> tuple[str, str]:
        """The text the template puts before a ``role`` message's content
        when it follows a user message, and after a user message's content;
        ``("", "")`` where the template will not render such a chat."""
        try:
            single = self._render([{"role": "user", "content": _PROBE}], False)
            pair = self._render(
                [{"role": "user", "content": _PROBE}, {"role": role, "content": _PROBE}], False
            )
        except ValueError:
            return "", ""
        first, second = pair.find(_PROBE), pair.rfind(_PROBE)
        if single.find(_PROBE) < 0 or first == second:
            return "", ""
        closer = single[single.find(_PROBE) + len(_PROBE) :]
        return pair[first + len(_PROBE) : second].removeprefix(closer), closer


@functools.cache
def prompt_tokenizer_of(model_path: str) -> ModelPromptTokenizer | None:
    """The model directory's prompt tokenizer, or None for no directory
    (the simulator's word pieces). Errors as :class:`ModelPromptTokenizer`'s.
    Loaded once per process and directory: it is stateless once loaded."""
    if not model_path:
        return None
    return ModelPromptTokenizer(Path(model_path).expanduser())
