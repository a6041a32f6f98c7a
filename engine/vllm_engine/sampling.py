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
  json_schema by vLLM's JSON object grammar and the client's schema. The
  pod's structured-output backend (xgrammar, see
  :mod:`engine.vllm_engine.config`) compiles them; a schema feature it
  lacks is refused by vLLM when the request is added, and the backend
  names the parameter it came from (:func:`guided_param`: the tool's
  parameters or the response format's schema).

Refused, as ``INVALID_ARGUMENT`` naming the parameter, because vLLM cannot
do them here: one guided reply that would follow two grammars (a tool
choice that forces calls plus a JSON response format), a JSON response
format with tool_choice auto (the grammar would leave the model no way to
call a tool), and ``ignore_eos`` with guided decoding (the grammar ends
the reply with the end-of-sequence token).

A continuation of a guided reply is guided too: vLLM starts a grammar at
the first output token, so the grammar goes to
:mod:`engine.vllm_engine.resumed_grammar`, which reads the resumed tokens
first and masks only what follows.
"""

from __future__ import annotations

import json
from typing import Any

from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

from engine.backend import GenerationRequest, ResponseFormatType, SamplingOptions, ToolChoiceMode
from engine.tool_calls import parameters_schema, tool_call_schema
from engine.vllm_engine import resumed_grammar
from llmmesh.errors import InvalidArgument, Reason


def _refuse(message: str, param: str) -> InvalidArgument:
    return InvalidArgument(Reason.INVALID_SAMPLING, message, metadata={"param": param})


def guided_param(sampling: SamplingOptions) -> str | None:
    """The request parameter a guided generation's grammar comes from, as
    the OpenAI API names it, None when it is not guided: the first tool
    whose parameters schema xgrammar cannot compile (``tools[i].function.
    parameters``), else ``tool_choice``; or the response format's schema."""
    mode = sampling.tool_choice.mode
    if mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.NAMED):
        for index, tool in enumerate(sampling.tools):
            if mode == ToolChoiceMode.NAMED and tool.name != sampling.tool_choice.name:
                continue
            try:
                schema = json.dumps(parameters_schema(tool))
            except ValueError:
                return f"tools[{index}].function.parameters"
            if not _compiles(schema):
                return f"tools[{index}].function.parameters"
        return "tool_choice"
    response_format = sampling.response_format
    if response_format is None or response_format.type == ResponseFormatType.TEXT:
        return None
    if response_format.type == ResponseFormatType.JSON_SCHEMA:
        return "response_format.json_schema.schema"
    return "response_format"


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


# vLLM's xgrammar backend compiles json_object as this schema.
JSON_OBJECT_SCHEMA = '{"type": "object"}'


def guided_schema(sampling: SamplingOptions) -> str | None:
    """The JSON Schema (text) a guided generation follows, None for free
    text. Raises ``InvalidArgument`` for the combinations the module
    docstring lists."""
    mode = sampling.tool_choice.mode
    response_format = sampling.response_format
    json_format = response_format is not None and response_format.type != ResponseFormatType.TEXT
    if mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.NAMED):
        if json_format:
            raise _refuse(
                f"response_format {response_format.type.value!r} cannot be combined with tool_choice "  # type: ignore[union-attr]
                f"{mode.value!r}: the reply is the tool calls, guided by their own schema",
                "response_format",
            )
        try:
            schema = tool_call_schema(sampling.tools, sampling.tool_choice, sampling.parallel_tool_calls)
        except (ValueError, StopIteration) as exc:
            raise _refuse(f"the tools cannot guide the reply: {exc}", "tools") from exc
        return json.dumps(schema)
    if not json_format:
        return None
    assert response_format is not None
    if mode == ToolChoiceMode.AUTO:
        raise _refuse(
            f"response_format {response_format.type.value!r} cannot be combined with tool_choice 'auto' "
            "on this engine: the JSON grammar would leave the model no way to call a tool; "
            "use tool_choice 'none', 'required' or a named tool",
            "response_format",
        )
    if response_format.type == ResponseFormatType.JSON_OBJECT:
        return JSON_OBJECT_SCHEMA
    try:
        json.loads(response_format.schema_json)
    except ValueError as exc:
        raise _refuse(f"the schema is not JSON: {exc}", "response_format.json_schema.schema") from exc
    return response_format.schema_json


def sampling_params(
    request: GenerationRequest, max_tokens: int, keep_special_tokens: bool = False
) -> SamplingParams:
    """vLLM's parameters for ``request``, generating at most ``max_tokens``
    (what is left of the request's own limit after resumed tokens).
    ``keep_special_tokens`` keeps special tokens in the text, for a tool
    parser whose markers are special tokens."""
    sampling = request.sampling
    schema = guided_schema(sampling)
    guided: StructuredOutputsParams | None = None
    resumed: dict[str, Any] | None = None
    if schema is not None:
        if sampling.ignore_eos:
            raise _refuse(
                "ignore_eos cannot be combined with guided decoding (a tool choice that forces calls "
                "or a JSON response format): the grammar ends the reply",
                "ignore_eos",
            )
        if request.resume_output_token_ids:
            # vLLM would start the grammar afresh after the resumed tokens.
            resumed = resumed_grammar.extra_args(schema, list(request.resume_output_token_ids))
        elif _is_json_object(sampling):
            guided = StructuredOutputsParams(json_object=True)
        else:
            guided = StructuredOutputsParams(json=schema)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0 if sampling.temperature is None else sampling.temperature,
        top_p=1.0 if sampling.top_p is None else sampling.top_p,
        stop=list(sampling.stop) or None,
        seed=sampling.seed,
        ignore_eos=sampling.ignore_eos,
        presence_penalty=sampling.presence_penalty or 0.0,
        frequency_penalty=sampling.frequency_penalty or 0.0,
        logit_bias=dict(sampling.logit_bias) or None,
        # vLLM's count excludes the sampled token, which it always adds.
        logprobs=(sampling.top_logprobs or 0) if sampling.logprobs else None,
        structured_outputs=guided,
        extra_args=resumed,
        skip_special_tokens=not keep_special_tokens,
        output_kind=RequestOutputKind.DELTA,
    )


def _is_json_object(sampling: SamplingOptions) -> bool:
    response_format = sampling.response_format
    return response_format is not None and response_format.type == ResponseFormatType.JSON_OBJECT
