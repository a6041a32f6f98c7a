"""Guided replies of the simulator: tool calls and JSON content.

Which reply a request gets, decided before its first token from (prompt,
seed) alone, so a continuation decides the same:

- ``tool_choice`` named: the named tool's arguments, valid against its
  parameters schema (the output format of :mod:`engine.tool_calls`).
- ``tool_choice`` required: an array of calls (one, or with
  ``parallel_tool_calls`` one to three) of tools drawn from the list.
- ``tool_choice`` auto: the simulator calls a tool when the last user
  message names its function name as a word (``get_weather`` in "what
  does get_weather say?") and no tool message follows it (a tool's result
  is answered in text, so an agent's loop ends): each tool so named, in the
  order of the tool list, at most one without ``parallel_tool_calls``.
  Otherwise it answers in text, as below.
- ``response_format`` json_object: a JSON object; json_schema: an instance
  of the schema (the subset of :mod:`engine.sim.json_schema`).
- Anything else is free text (:mod:`engine.sim.sampler`).

Every tool's parameters schema is checked when tools may be called, and a
schema outside the subset is refused (INVALID_ARGUMENT naming the param)
whether or not the reply would have used it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.engine.backend import ResponseFormatType, SamplingOptions, ToolChoiceMode, ToolSpec
from llmmesh.engine.sim.distribution import SampledToken
from llmmesh.engine.sim.json_schema import CompiledSchema, FreeObjectNode, SchemaNotSupported, compile_schema
from llmmesh.engine.sim.json_writer import JsonWriter
from llmmesh.engine.sim.model_tokenizer import PromptTokenizer
from llmmesh.engine.sim.sampler import DeterministicSampler, ReplyPlan
from llmmesh.engine.sim.tokenizer import SimTokenizer
from llmmesh.engine.tool_calls import parameters_schema

MAX_PARALLEL_CALLS = 3


@dataclass(frozen=True)
class GuidedReply:
    """The whole output of a guided reply. ``tool_calls``: the output is
    tool calls, in the array format or, with ``named``, the arguments of
    the one call to ``named``."""

    tokens: tuple[SampledToken, ...]
    tool_calls: bool
    named: str | None = None


def guided_reply(
    prompt_token_ids: Sequence[int],
    sampling: SamplingOptions,
    plan: ReplyPlan,
    sampler: DeterministicSampler,
    tokenizer: SimTokenizer,
    prompts: PromptTokenizer | None = None,
) -> GuidedReply | None:
    """The guided reply of a request, or None for free text; ``prompts``
    reads the prompt (``tokenizer``, which writes the reply, by default).
    Raises ``InvalidArgument`` for a schema outside the supported subset."""
    mode = sampling.tool_choice.mode
    response_format = sampling.response_format
    json_content = response_format is not None and response_format.type != ResponseFormatType.TEXT
    if not json_content and (mode == ToolChoiceMode.NONE or not sampling.tools):
        return None  # free text: the common case costs nothing more
    writer = JsonWriter(tokenizer, plan, bare_words=sampler.bare_words, spaced_words=sampler.words)
    if mode != ToolChoiceMode.NONE and sampling.tools:
        schemas = [_tool_schema(tool, i) for i, tool in enumerate(sampling.tools)]
        if mode == ToolChoiceMode.NAMED:
            index = next(i for i, tool in enumerate(sampling.tools) if tool.name == sampling.tool_choice.name)
            _write(writer, schemas[index], f"tools[{index}].function.parameters")
            return GuidedReply(tuple(writer.tokens), True, sampling.tool_choice.name)
        limit = MAX_PARALLEL_CALLS if sampling.parallel_tool_calls else 1
        if mode == ToolChoiceMode.REQUIRED:
            calls = [writer.choose(len(sampling.tools)) for _ in range(1 + writer.choose(limit))]
        else:
            calls = _named_in_last_user_message(sampling.tools, prompt_token_ids, prompts or tokenizer)[
                :limit
            ]
        if calls:
            writer.forced("[")
            for n, i in enumerate(calls):
                head = '{"name": ' + json.dumps(sampling.tools[i].name) + ', "arguments": '
                writer.forced(("" if n == 0 else ", ") + head)
                _write(writer, schemas[i], f"tools[{i}].function.parameters")
                writer.forced("}")
            writer.forced("]")
            return GuidedReply(tuple(writer.tokens), True)
    if response_format is None or response_format.type == ResponseFormatType.TEXT:
        return None
    if response_format.type == ResponseFormatType.JSON_OBJECT:
        schema = CompiledSchema(FreeObjectNode(), {})
    else:
        schema = _compiled(json.loads(response_format.schema_json), "response_format.json_schema.schema")
    _write(writer, schema, "response_format.json_schema.schema")
    return GuidedReply(tuple(writer.tokens), False)


def _tool_schema(tool: ToolSpec, index: int) -> CompiledSchema:
    return _compiled(parameters_schema(tool), f"tools[{index}].function.parameters")


@contextmanager
def _refused_as(param: str) -> Iterator[None]:
    """A schema the simulator cannot follow, refused naming ``param``."""
    try:
        yield
    except SchemaNotSupported as exc:
        raise InvalidArgument(
            Reason.INVALID_SAMPLING,
            f"the simulator's guided decoding cannot follow this schema: {exc}",
            metadata={"param": param},
        ) from exc


def _compiled(schema: object, param: str) -> CompiledSchema:
    with _refused_as(param):
        if not isinstance(schema, dict):
            raise SchemaNotSupported("the schema is not a JSON object")
        return compile_schema(schema)


def _write(writer: JsonWriter, schema: CompiledSchema, param: str) -> None:
    with _refused_as(param):
        writer.value(schema, schema.root)


def _named_in_last_user_message(
    tools: Sequence[ToolSpec], prompt_token_ids: Sequence[int], prompts: PromptTokenizer
) -> list[int]:
    """Indexes of the tools whose names the last user message names, none
    when a tool message follows it; a prompt not rendered as chat counts as
    one user message."""
    text = prompts.last_user_message(prompt_token_ids)
    if text is None:
        return []
    return [
        i
        for i, tool in enumerate(tools)
        if re.search(rf"(?<![A-Za-z0-9_-]){re.escape(tool.name)}(?![A-Za-z0-9_-])", text)
    ]
