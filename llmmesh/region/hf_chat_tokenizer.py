"""A vLLM pod's chat tokenization, run in the region from what the pod publishes.

The pod renders a chat with transformers' ``apply_chat_template`` and
encodes the text without adding special tokens. This does the same with the
two libraries transformers itself uses for it, ``jinja2`` and ``tokenizers``,
configured as transformers configures them (a sandboxed environment with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, its
``tojson``, ``raise_exception`` and ``strftime_now``; the special tokens as
template variables). Both libraries come with the ``vllm`` extra; where they
are missing, or a template needs more than this (transformers' own
``{% generation %}`` tag), :func:`hf_chat_tokenizer` gives up and the region
asks the pod instead.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from llmmesh.core.chat_tokenizer import HfTokenizerSpec

log = logging.getLogger(__name__)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' filter: Jinja's own escapes HTML characters.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class HfChatTokenizer:
    """Renders chat turns with a chat template and encodes them; see the module docstring.

    ``renders_tools`` says whether the template renders tools and tool
    calls itself (it reads ``tools`` and mentions ``tool_calls``); the
    region renders them as text into the messages of one that does not
    (:mod:`region.tokenizer_client`), so they still reach the model."""

    def __init__(self, spec: HfTokenizerSpec) -> None:
        """Raises ImportError without ``jinja2`` or ``tokenizers``, and their
        errors for a tokenizer or template they cannot load."""
        import jinja2.ext
        import jinja2.meta
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = _strftime_now
        self._template = env.from_string(spec.chat_template)
        # A template that reads no tools (nor calls) would drop them from the prompt.
        read = jinja2.meta.find_undeclared_variables(env.parse(spec.chat_template))
        self.renders_tools = "tools" in read and "tool_calls" in spec.chat_template
        self._tokenizer = Tokenizer.from_str(spec.tokenizer_json)
        self._variables = dict(spec.template_variables)

    def render_chat(self, turns: Iterable[tuple[str, str]], add_generation_prompt: bool) -> list[int]:
        """Token ids of chat turns ``(role, content)``. Raises ValueError for
        no turns (transformers refuses an empty chat) and the template's
        errors (say, for a role it does not know)."""
        messages = [{"role": role, "content": content} for role, content in turns]
        return self.render_messages(messages, None, add_generation_prompt)

    def render_messages(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> list[int]:
        """Token ids of chat messages as a template reads them (with
        ``tool_calls`` and ``tool_call_id`` where they have them) and the
        ``tools`` it may offer (:mod:`region.turn.prompt_render`); errors as
        :meth:`render_chat`'s. A template that ignores ``tools`` leaves
        them out of the prompt, as transformers would."""
        if not messages:
            raise ValueError("an empty chat has no rendering")
        text = self._template.render(
            **self._variables,
            messages=messages,
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
        )
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids


def hf_chat_tokenizer(spec: HfTokenizerSpec) -> HfChatTokenizer | None:
    """The tokenizer for ``spec``, or None (logged) when it cannot run here."""
    try:
        return HfChatTokenizer(spec)
    except ImportError as err:
        log.info("chat prompts are tokenized by the engine pods: %s", err)
    except Exception as err:  # a template or tokenizer.json these libraries reject
        log.warning("cannot tokenize the published tokenizer locally (%s); asking the pods", err)
    return None
