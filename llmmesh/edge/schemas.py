"""The OpenAI request bodies the edge accepts, and their translation to the
contract. Validation failures become 400s naming the offending ``param``.

Every parameter of OpenAI's Chat Completions reference is modelled, and is
either honoured end to end or refused with a 400 naming it
(``unsupported_parameter``); a parameter the reference does not have is
refused as ``unknown_parameter``. Honoured: ``model``, ``messages``
(:mod:`edge.chat_messages`), ``max_tokens``, ``max_completion_tokens``,
``temperature``, ``top_p``, ``stop``, ``seed``, ``stream``,
``stream_options.include_usage``, ``presence_penalty``,
``frequency_penalty``, ``logit_bias``, ``logprobs``, ``top_logprobs``,
``tools``, ``tool_choice``, ``parallel_tool_calls``, ``response_format``
(:mod:`edge.tool_params`), ``n`` of 1, ``modalities`` of text only,
``store`` false, ``service_tier`` "auto" or "default" (the tenant's tier
decides), ``reasoning_effort`` "none" (the mesh's models do not reason),
``user`` and ``safety_identifier`` (the end-user id the region is given),
``verbosity`` (an instruction to the model, :mod:`edge.verbosity`; a
conversation message refuses it) and vLLM's extension ``ignore_eos``. Everything else the reference lists is
refused when set: ``n`` > 1, ``audio``, audio ``modalities``,
``prediction``, ``web_search_options``, other ``reasoning_effort`` values,
the legacy ``functions`` and ``function_call`` (use
``tools``), ``store`` true, ``metadata``, other service tiers, the
``prompt_cache_*`` parameters (prefix caching is automatic),
``moderation`` (the region's safety filters always run), and
``stream_options.include_obfuscation`` true.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, TypeVar

from pydantic import BaseModel, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from llmmesh.edge.chat_messages import Message, TextPart, chat_messages, refused
from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.request_types import AnyJson, Int32, Int64, ModelName, Strict, Text
from llmmesh.edge.retrieval_options import RetrievalOptions
from llmmesh.edge.tool_params import (
    MAX_TOOLS,
    ResponseFormat,
    Tool,
    ToolChoiceParam,
    apply_tool_choice,
    tool_definitions,
)
from llmmesh.edge.verbosity import Verbosity, with_verbosity
from llmmesh.v1 import common_pb2

__all__ = [
    "ChatCompletionRequest",
    "Message",
    "ModelName",
    "TextPart",
    "TurnOptions",
    "chat_messages",
    "parse_body",
    "parse_chat_request",
]

Body = TypeVar("Body", bound=BaseModel)

MAX_LOGIT_BIAS = 1024
"""The most token ids one ``logit_bias`` may name."""
MAX_TOP_LOGPROBS = 20
Penalty = Annotated[StrictFloat, Field(ge=-2, le=2)]


class StreamOptions(Strict):
    """``stream_options`` of a streaming request."""

    include_usage: StrictBool | None = None
    include_obfuscation: StrictBool | None = Field(
        default=None, description="Only false: the mesh never pads its chunks."
    )


def _refusal(description: str) -> AnyJson:
    return Field(default=None, description=f"Refused when set: {description}")


class TurnOptions(Strict):
    """What a request for a turn sets besides its messages: the output limit,
    sampling, tools, the reply's format and streaming. Chat completions and
    conversation messages share it."""

    max_tokens: Int32 | None = Field(default=None, description="The most output tokens (at least 1).")
    max_completion_tokens: Int32 | None = Field(
        default=None, description="As max_tokens, which it overrides."
    )
    temperature: Annotated[StrictFloat, Field(ge=0, le=2)] | None = Field(
        default=None, description="0 (or absent) decodes greedily."
    )
    top_p: Annotated[StrictFloat, Field(gt=0, le=1)] | None = None
    stop: Text | Annotated[list[Text], Field(max_length=4)] | None = Field(
        default=None, description="Up to 4 sequences; the reply ends before the first one."
    )
    seed: Int64 | None = Field(default=None, description="Reproducible sampling.")
    stream: StrictBool | None = Field(
        default=False, description="Answer as SSE chat.completion.chunk events."
    )
    stream_options: StreamOptions | None = Field(default=None, description="Only with stream: true.")
    n: StrictInt | None = Field(default=None, description="Only 1: one choice per request.")
    user: Text | None = Field(default=None, description="The end user's id, given to the region.")
    safety_identifier: Text | None = Field(default=None, description="The end user, as `user`.")
    presence_penalty: Penalty | None = Field(default=None, description="Penalises tokens already output.")
    frequency_penalty: Penalty | None = Field(
        default=None, description="Penalises tokens by how often they were output."
    )
    logit_bias: (
        Annotated[dict[str, Annotated[StrictFloat, Field(ge=-100, le=100)]], Field(max_length=MAX_LOGIT_BIAS)]
        | None
    ) = Field(default=None, description="Token id (a decimal string) to a bias from -100 to 100.")
    logprobs: StrictBool | None = Field(default=None, description="Each output token's log probability.")
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = Field(
        default=None, description="With logprobs: this many likeliest alternatives per token."
    )
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = Field(
        default=None, description="Function tools (custom tools are refused)."
    )
    tool_choice: ToolChoiceParam | None = Field(
        default=None,
        description='"none", "auto", "required", a named function, or allowed_tools; required and named'
        " calls are guided to valid arguments.",
    )
    parallel_tool_calls: StrictBool | None = Field(
        default=None, description="false: at most one tool call per reply."
    )
    response_format: ResponseFormat | None = Field(
        default=None, description="text, json_object or json_schema; JSON replies are guided to be valid."
    )
    modalities: list[Literal["text", "audio"]] | None = Field(default=None, description='Only ["text"].')
    store: StrictBool | None = Field(default=None, description="Only false: completions are not stored.")
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = Field(
        default=None, description='Only "auto" or "default": the tenant\'s tier decides.'
    )
    reasoning_effort: StrictStr | None = Field(default=None, description='Only "none": no model reasons.')
    # vLLM's extension (``extra_body`` in the openai SDK): generate exactly
    # the output limit, for benchmarks and tests that need fixed lengths.
    ignore_eos: StrictBool = Field(
        default=False, description="vLLM's extension: generate exactly the output limit."
    )
    audio: AnyJson = _refusal("audio output is not supported.")
    prediction: AnyJson = _refusal("predicted outputs are not supported.")
    web_search_options: AnyJson = _refusal("web search is not supported.")
    verbosity: Verbosity | None = Field(
        default=None,
        description="low, medium or high: an instruction to answer briefly or thoroughly "
        "(chat completions; refused on conversation messages).",
    )
    functions: AnyJson = _refusal("legacy; use tools.")
    function_call: AnyJson = _refusal("legacy; use tool_choice.")
    metadata: AnyJson = Field(
        default=None, description="Refused unless empty ({}): completions are not stored."
    )
    prompt_cache_key: AnyJson = _refusal("prefix caching is automatic.")
    prompt_cache_retention: AnyJson = _refusal("prefix caching is automatic.")
    prompt_cache_options: AnyJson = _refusal("prefix caching is automatic.")
    moderation: AnyJson = _refusal("the region's safety filters always run.")
    # Whether the request's messages take the verbosity instruction (edge.verbosity).
    honours_verbosity: ClassVar[bool] = False

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def streaming(self) -> bool:
        return bool(self.stream)

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def end_user(self) -> str:
        """The end-user id the region is given: ``safety_identifier``, which replaces ``user``."""
        return self.safety_identifier or self.user or ""

    def check_supported(self) -> None:
        """A 400 naming the first parameter set to something the mesh does not honour."""
        for name, why in (
            ("audio", "audio output is not supported"),
            ("prediction", "predicted outputs are not supported"),
            ("web_search_options", "web search is not supported"),
            ("verbosity", "verbosity is honoured on chat completions, not on conversation messages"),
            ("functions", "the legacy functions are not supported; use tools"),
            ("function_call", "the legacy function_call is not supported; use tool_choice"),
            ("metadata", "completions are not stored, so they carry no metadata"),
            ("prompt_cache_key", "prefix caching is automatic (KV-affinity routing)"),
            ("prompt_cache_retention", "prefix caching is automatic (KV-affinity routing)"),
            ("prompt_cache_options", "prefix caching is automatic (KV-affinity routing)"),
            ("moderation", "the region's safety filters always run; they cannot be configured per request"),
        ):
            value = getattr(self, name)
            # An empty metadata object asks nothing (clients send {} by default).
            if name == "verbosity" and self.honours_verbosity:
                continue
            if value is not None and not (name == "metadata" and value == {}):
                raise refused(name, why)
        if self.n is not None and self.n != 1:
            if self.n < 1:
                raise OpenAIError(400, "n must be at least 1", param="n", code="invalid_value")
            raise refused("n", "only one choice per request (n=1) is supported; send several requests")
        if self.modalities is not None and "audio" in self.modalities:
            raise refused("modalities", "only text output is supported")
        if self.store:
            raise refused("store", "completions are not stored")
        if self.service_tier not in (None, "auto", "default"):
            raise refused("service_tier", "the tenant's tier decides how a request is served")
        if self.reasoning_effort not in (None, "none"):
            raise refused("reasoning_effort", "the mesh's models do not reason")
        if self.stream_options is not None:
            if not self.stream:
                raise OpenAIError(
                    400,
                    "stream_options is only allowed when stream is true",
                    param="stream_options",
                    code="invalid_value",
                )
            if self.stream_options.include_obfuscation:
                raise refused("stream_options.include_obfuscation", "the mesh does not pad its chunks")
        if self.top_logprobs is not None and not self.logprobs:
            raise OpenAIError(
                400, "top_logprobs needs logprobs set to true", param="top_logprobs", code="invalid_value"
            )
        if self.parallel_tool_calls is not None and not self.tools:
            raise OpenAIError(
                400, "parallel_tool_calls needs tools", param="parallel_tool_calls", code="invalid_value"
            )

    def to_sampling(self) -> common_pb2.SamplingParams:
        """The contract's sampling parameters; a 400 names the first parameter refused or out of range."""
        self.check_supported()
        sampling = common_pb2.SamplingParams()
        limit = self.output_limit()
        if limit is not None:
            if limit < 1:
                param = "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"
                raise OpenAIError(400, f"{param} must be at least 1", param=param, code="invalid_value")
            sampling.max_tokens = limit
        if self.temperature is not None:
            sampling.temperature = float(self.temperature)
        if self.top_p is not None:
            sampling.top_p = float(self.top_p)
        if self.seed is not None:
            sampling.seed = self.seed
        if self.stop is not None:
            sampling.stop.extend([self.stop] if isinstance(self.stop, str) else self.stop)
        sampling.ignore_eos = self.ignore_eos
        if self.presence_penalty is not None:
            sampling.presence_penalty = float(self.presence_penalty)
        if self.frequency_penalty is not None:
            sampling.frequency_penalty = float(self.frequency_penalty)
        for key, bias in (self.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit() and len(key) <= 10 and int(key) < 2**32):
                raise OpenAIError(
                    400,
                    f"logit_bias keys are token ids (decimal strings), got {key!r}",
                    param="logit_bias",
                    code="invalid_value",
                )
            sampling.logit_bias[int(key)] = float(bias)
        sampling.logprobs = bool(self.logprobs)
        if self.top_logprobs is not None:
            sampling.top_logprobs = self.top_logprobs
        apply_tool_choice(self.tool_choice, tool_definitions(self.tools or []), sampling)
        if self.parallel_tool_calls is not None:
            sampling.parallel_tool_calls = self.parallel_tool_calls
        if self.response_format is not None:
            sampling.response_format.CopyFrom(self.response_format.to_proto())
        return sampling


class ChatCompletionRequest(TurnOptions):
    """``POST /v1/chat/completions``."""

    model: ModelName
    messages: list[Message] = Field(min_length=1)
    # The mesh's extension (edge.retrieval_options): chunks of vector stores in the context.
    llmmesh_retrieval: RetrievalOptions | None = Field(
        default=None, description="llmmesh's extension: put chunks of these vector stores in the context."
    )

    honours_verbosity: ClassVar[bool] = True

    def to_messages(self) -> list[common_pb2.ChatMessage]:
        """The messages, with the ``verbosity`` instruction when one was asked."""
        return with_verbosity(chat_messages(self.messages), self.verbosity)


# pydantic names union branches in an error's location; they are not fields.
_BRANCH_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "function-after"})


def _param(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _BRANCH_TAGS or "[" in part or part[:1].isupper() or part.startswith("literal"):
            continue
        else:
            out += f".{part}" if out else part
    return out


def parse_chat_request(body: object) -> ChatCompletionRequest:
    """Validate a decoded JSON body, or raise a 400 OpenAIError (a
    parameter the mesh refuses included)."""
    request = parse_body(ChatCompletionRequest, body)
    request.check_supported()
    return request


def parse_body(model: type[Body], body: object) -> Body:
    """Validate a decoded JSON body as ``model``, or raise a 400 OpenAIError naming the ``param``."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = _param(tuple(first["loc"]))
        if first["type"] == "extra_forbidden":
            raise OpenAIError(
                400,
                f"unrecognized request argument supplied: '{param}'",
                param=param,
                code="unknown_parameter",
            ) from exc
        if first["type"] == "missing":
            raise OpenAIError(
                400, f"missing required parameter: '{param}'", param=param, code="missing_required_parameter"
            ) from exc
        raise OpenAIError(
            400, f"invalid value for '{param}': {first['msg']}", param=param, code="invalid_value"
        ) from exc
