"""The OpenAI request bodies the edge accepts, and their translation to the
contract. Validation failures become 400s naming the offending ``param``."""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from edge.errors import OpenAIError
from llmmesh.v1 import common_pb2

Body = TypeVar("Body", bound=BaseModel)


def _encodable(text: str) -> str:
    # JSON can carry a lone surrogate ("\udc80"); protobuf strings cannot.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("must be valid UTF-8 text") from exc
    return text


Text = Annotated[StrictStr, AfterValidator(_encodable)]
"""A string the contract can carry."""
Int32 = Annotated[StrictInt, Field(ge=-(2**31), le=2**31 - 1)]
Int64 = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]
ModelName = Annotated[StrictStr, Field(max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")]
"""A model name as the registry allows one ("auto" included): a name that
could never exist is refused here, before it travels through the mesh."""

_ROLE: dict[str, common_pb2.ChatRole.ValueType] = {
    "system": common_pb2.CHAT_ROLE_SYSTEM,
    "developer": common_pb2.CHAT_ROLE_DEVELOPER,
    "user": common_pb2.CHAT_ROLE_USER,
    "assistant": common_pb2.CHAT_ROLE_ASSISTANT,
    "tool": common_pb2.CHAT_ROLE_TOOL,
}


class TextPart(BaseModel):
    """One text part of a multi-part message content."""

    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: StrictStr


class Message(BaseModel):
    """One chat message."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    name: Text | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(BaseModel):
    """``stream_options`` of a streaming request."""

    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


class TurnOptions(BaseModel):
    """What a request for a turn sets besides its messages: the output limit,
    sampling and streaming. Chat completions and conversation messages share it."""

    model_config = ConfigDict(extra="allow")
    max_tokens: Int32 | None = None
    max_completion_tokens: Int32 | None = None
    temperature: Annotated[StrictFloat, Field(ge=0, le=2)] | None = None
    top_p: Annotated[StrictFloat, Field(gt=0, le=1)] | None = None
    stop: Text | Annotated[list[Text], Field(max_length=4)] | None = None
    seed: Int64 | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Annotated[StrictInt, Field(ge=1, le=1)] = 1
    user: Text | None = None
    # vLLM's extension (``extra_body`` in the openai SDK): generate exactly
    # the output limit, for benchmarks and tests that need fixed lengths.
    ignore_eos: StrictBool = False

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def to_sampling(self) -> common_pb2.SamplingParams:
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
        return sampling


class ChatCompletionRequest(TurnOptions):
    """``POST /v1/chat/completions``."""

    model: ModelName
    messages: list[Message] = Field(min_length=1)

    def to_messages(self) -> list[common_pb2.ChatMessage]:
        return chat_messages(self.messages)


def chat_messages(messages: list[Message]) -> list[common_pb2.ChatMessage]:
    """The contract's messages; a 400 names a content that is not valid UTF-8."""
    out = []
    for i, m in enumerate(messages):
        text = m.text()
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise OpenAIError(
                400,
                f"messages[{i}].content is not valid UTF-8 text",
                param=f"messages[{i}].content",
                code="invalid_value",
            ) from exc
        out.append(common_pb2.ChatMessage(role=_ROLE[m.role], content=text, name=m.name or ""))
    return out


def _param(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif (
            part in ("str", "int", "float", "bool", "list[TextPart]", "list[constrained-str]") or "[" in part
        ):
            # pydantic names union branches in the location; they are not fields
            continue
        else:
            out += f".{part}" if out else part
    return out


def parse_chat_request(body: object) -> ChatCompletionRequest:
    """Validate a decoded JSON body, or raise a 400 OpenAIError."""
    return parse_body(ChatCompletionRequest, body)


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
