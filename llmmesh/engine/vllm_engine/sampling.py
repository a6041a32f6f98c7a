"""A request's :class:`engine.backend.SamplingOptions` in vLLM's terms:
``vllm.SamplingParams``, with the guided decoding that tool choices and
response formats need as ``StructuredOutputsParams``.

Every option is honoured or refused here; none is dropped:

- penalties and ``logit_bias`` go to vLLM's own fields;
- ``logprobs`` asks vLLM for ``top_logprobs`` (0 without it) alternatives
  per position, and vLLM always adds the sampled token's own;
- ``tool_choice`` named is guided by the tool's parameters schema and
  required by :func:`engine.tool_calls.tool_call_schema` (the array of
  ``{"name", "arguments"}`` calls); ``response_format`` json_object and
  json_schema by vLLM's JSON object grammar and the client's schema;
  tool_choice auto by the structural tag of the model's call syntax
  (:mod:`engine.vllm_engine.auto_tools`: free text or valid calls; with a
  JSON response format, the JSON or valid calls). The pod's
  structured-output backend (xgrammar, see
  :mod:`engine.vllm_engine.config`) compiles them. A schema keyword it
  cannot follow is refused here, named with where it is and the parameter
  it came from (:mod:`engine.vllm_engine.xgrammar_schema`); what vLLM
  still refuses when the request is added is named by the parameter
  (:func:`guided_param`: the tool's parameters or the response format's
  schema).

Refused, as ``INVALID_ARGUMENT`` naming the parameter, because vLLM cannot
do them here: a JSON response format with a tool choice that forces calls
(the reply is the calls, guided by their own schema), and ``ignore_eos``
with guided decoding (the grammar ends the reply with the end-of-sequence
token).

A guided reply never samples a token holding a raw control character
(:data:`ControlTokens`), so its JSON parses strictly. A continuation of a
guided reply is guided too: vLLM starts a grammar at
the first output token, so the grammar goes to
:mod:`engine.vllm_engine.resumed_grammar`, which reads the resumed tokens
first and masks only what follows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.engine.backend import GenerationRequest, ResponseFormatType, SamplingOptions, ToolChoiceMode
from llmmesh.engine.schema_subset import SchemaNotSupported
from llmmesh.engine.tool_calls import parameters_schema, tool_call_schema
from llmmesh.engine.vllm_engine import resumed_grammar, xgrammar_schema
from llmmesh.engine.vllm_engine.auto_tools import AutoToolCalls


def _refuse(message: str, param: str) -> InvalidArgument:
    return InvalidArgument(Reason.INVALID_SAMPLING, message, metadata={"param": param})


def _check_schema(schema: object, param: str) -> None:
    """Refuse, naming ``param``, a schema xgrammar cannot follow."""
    try:
        xgrammar_schema.check_schema(schema)
    except SchemaNotSupported as exc:
        raise _refuse(f"vLLM's guided decoding (xgrammar) cannot follow this schema: {exc}", param) from exc


def guided_param(sampling: SamplingOptions) -> str | None:
    """The request parameter a guided generation's grammar comes from, as
    the OpenAI API names it, None when it is not guided: the first tool
    whose parameters schema xgrammar cannot compile (``tools[i].function.
    parameters``), else the response format's schema, else ``tool_choice``."""
    mode = sampling.tool_choice.mode
    if mode != ToolChoiceMode.NONE and sampling.tools:
        for index, tool in enumerate(sampling.tools):
            if mode == ToolChoiceMode.NAMED and tool.name != sampling.tool_choice.name:
                continue
            try:
                schema = json.dumps(parameters_schema(tool))
            except ValueError:
                return f"tools[{index}].function.parameters"
            if not _compiles(schema):
                return f"tools[{index}].function.parameters"
    response_format = sampling.response_format
    json_schema = response_format is not None and response_format.type == ResponseFormatType.JSON_SCHEMA
    if json_schema and not _compiles(response_format.schema_json):  # type: ignore[union-attr]
        return "response_format.json_schema.schema"
    if mode != ToolChoiceMode.NONE and sampling.tools:
        return "tool_choice"
    if json_schema:
        return "response_format.json_schema.schema"
    if response_format is not None and response_format.type != ResponseFormatType.TEXT:
        return "response_format"
    return None


def _compiles(schema_json: str) -> bool:
    """Whether vLLM's xgrammar backend takes this schema."""
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

    try:
        validate_xgrammar_grammar(
            SamplingParams(structured_outputs=StructuredOutputsParams(json=schema_json))
        )
    except (VLLMValidationError, ValueError):
        return False
    return True


MIN_LOGIT_BIAS = -100.0

# vLLM's xgrammar backend compiles json_object as this schema.
JSON_OBJECT_SCHEMA = '{"type": "object"}'


@dataclass(frozen=True)
class Grammar:
    """What guides a reply: ``kind`` is ``json`` (a JSON Schema),
    ``json_object`` or ``structural_tag`` (xgrammar's, JSON text)."""

    kind: str
    text: str

    def params(self) -> StructuredOutputsParams:
        """As vLLM's structured outputs of a fresh request."""
        if self.kind == "json_object":
            return StructuredOutputsParams(json_object=True)
        if self.kind == "structural_tag":
            return StructuredOutputsParams(structural_tag=self.text)
        return StructuredOutputsParams(json=self.text)


def guided_grammar(sampling: SamplingOptions, auto: AutoToolCalls | None = None) -> Grammar | None:
    """The grammar of a guided generation, None for free text; ``auto``
    reads the calls of a tool_choice auto reply. Raises ``InvalidArgument``
    for the combinations the module docstring lists."""
    mode = sampling.tool_choice.mode
    response_format = sampling.response_format
    reply_schema: str | None = None
    if response_format is not None and response_format.type == ResponseFormatType.JSON_OBJECT:
        reply_schema = JSON_OBJECT_SCHEMA
    elif response_format is not None and response_format.type == ResponseFormatType.JSON_SCHEMA:
        try:
            parsed = json.loads(response_format.schema_json)
        except ValueError as exc:
            raise _refuse(f"the schema is not JSON: {exc}", "response_format.json_schema.schema") from exc
        _check_schema(parsed, "response_format.json_schema.schema")
        reply_schema = response_format.schema_json
    if mode != ToolChoiceMode.NONE:
        for index, tool in enumerate(sampling.tools):
            param = f"tools[{index}].function.parameters"
            try:
                tool_schema = parameters_schema(tool)
            except ValueError as exc:
                raise _refuse(str(exc), param) from exc
            _check_schema(tool_schema, param)
    if mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.NAMED):
        if reply_schema is not None:
            raise _refuse(
                f"response_format {response_format.type.value!r} cannot be combined with tool_choice "  # type: ignore[union-attr]
                f"{mode.value!r}: the reply is the tool calls, guided by their own schema",
                "response_format",
            )
        try:
            schema = tool_call_schema(sampling.tools, sampling.tool_choice, sampling.parallel_tool_calls)
        except (ValueError, StopIteration) as exc:
            raise _refuse(f"the tools cannot guide the reply: {exc}", "tools") from exc
        return Grammar("json", json.dumps(schema))
    if auto is not None:
        tag = auto.structural_tag(sampling.parallel_tool_calls, reply_schema)
        if tag is not None:
            return Grammar("structural_tag", tag)
        if reply_schema is not None:
            raise _refuse(
                f"response_format {response_format.type.value!r} cannot be combined with tool_choice "  # type: ignore[union-attr]
                "'auto' for this model's tool-call syntax",
                "response_format",
            )
        return None
    if reply_schema is None:
        return None
    if reply_schema is JSON_OBJECT_SCHEMA:
        return Grammar("json_object", JSON_OBJECT_SCHEMA)
    return Grammar("json", reply_schema)


ControlTokens = Callable[[str], Sequence[int]]
"""The tokens a grammar of a kind must not sample: those holding a raw
control character. xgrammar's JSON strings admit them (all but CR and LF),
and strict JSON parsers, the OpenAI SDK's users' included, refuse them."""


def sampling_params(
    request: GenerationRequest,
    max_tokens: int,
    auto: AutoToolCalls | None = None,
    control_tokens: ControlTokens | None = None,
) -> SamplingParams:
    """vLLM's parameters for ``request``, generating at most ``max_tokens``
    (what is left of the request's own limit after resumed tokens); ``auto``
    reads the calls of a tool_choice auto reply; a guided reply never samples
    the ``control_tokens`` of its grammar's kind (a bias of -100, the
    client's own bias on them included)."""
    sampling = request.sampling
    grammar = guided_grammar(sampling, auto)
    guided: StructuredOutputsParams | None = None
    resumed: dict[str, Any] | None = None
    logit_bias = dict(sampling.logit_bias)
    if grammar is not None:
        if control_tokens is not None:
            logit_bias.update(dict.fromkeys(control_tokens(grammar.kind), MIN_LOGIT_BIAS))
        if sampling.ignore_eos:
            raise _refuse(
                "ignore_eos cannot be combined with guided decoding (tools or a JSON response "
                "format): the grammar ends the reply",
                "ignore_eos",
            )
        if request.resume_output_token_ids:
            # vLLM would start the grammar afresh after the resumed tokens.
            prefix = list(request.resume_output_token_ids)
            resumed = resumed_grammar.extra_args(grammar.kind, grammar.text, prefix)
        else:
            guided = grammar.params()
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0 if sampling.temperature is None else sampling.temperature,
        top_p=1.0 if sampling.top_p is None else sampling.top_p,
        stop=list(sampling.stop) or None,
        seed=sampling.seed,
        ignore_eos=sampling.ignore_eos,
        presence_penalty=sampling.presence_penalty or 0.0,
        frequency_penalty=sampling.frequency_penalty or 0.0,
        logit_bias=logit_bias or None,
        # vLLM's count excludes the sampled token, which it always adds.
        logprobs=(sampling.top_logprobs or 0) if sampling.logprobs else None,
        structured_outputs=guided,
        extra_args=resumed,
        # A tool parser whose markers may be special tokens needs them in the text.
        skip_special_tokens=not (auto is not None and auto.keep_special_tokens),
        output_kind=RequestOutputKind.DELTA,
    )
