"""The ``messages`` of a chat request, as the OpenAI API defines them, and
their translation to the contract's ChatMessage.

Honoured: the roles system, developer, user, assistant and tool; text
content as a string or as text parts; ``name``; an assistant's
``tool_calls`` (function calls) and ``refusal`` (it becomes the message's
text when it has no content); a tool message's ``tool_call_id``. Refused
with a 400 naming the field: the legacy ``function`` role and
``function_call``, assistant ``audio``, content parts other than text (and
refusal, on an assistant message), custom tool calls, and
``prompt_cache_breakpoint`` (the mesh's prefix caching is automatic).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictStr

from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.request_types import AnyJson, FunctionName, Strict, Text
from llmmesh.v1 import common_pb2

_ROLE: dict[str, common_pb2.ChatRole.ValueType] = {
    "system": common_pb2.CHAT_ROLE_SYSTEM,
    "developer": common_pb2.CHAT_ROLE_DEVELOPER,
    "user": common_pb2.CHAT_ROLE_USER,
    "assistant": common_pb2.CHAT_ROLE_ASSISTANT,
    "tool": common_pb2.CHAT_ROLE_TOOL,
}


def refused(param: str, message: str, code: str = "unsupported_parameter") -> OpenAIError:
    """The 400 of a parameter the mesh does not honour."""
    return OpenAIError(400, f"'{param}': {message}", param=param, code=code)


def missing(param: str) -> OpenAIError:
    """The 400 of a required parameter left out."""
    return OpenAIError(
        400, f"missing required parameter: '{param}'", param=param, code="missing_required_parameter"
    )


class TextPart(Strict):
    """One part of a multi-part content: text (any role), or a refusal (an
    assistant's). Image, audio and file parts are refused: multimodal input
    is not served yet."""

    type: Literal["text", "refusal", "image_url", "input_audio", "file"]
    text: StrictStr | None = None
    refusal: StrictStr | None = None
    image_url: AnyJson = Field(default=None, description="Refused: images are not supported.")
    input_audio: AnyJson = Field(default=None, description="Refused: audio is not supported.")
    file: AnyJson = Field(default=None, description="Refused: files are not supported.")
    prompt_cache_breakpoint: AnyJson = Field(
        default=None, description="Refused: prefix caching is automatic."
    )

    def text_of(self, param: str, role: str) -> str:
        """The part's text; a 400 naming ``param`` for a part the mesh refuses."""
        if self.prompt_cache_breakpoint is not None:
            raise refused(f"{param}.prompt_cache_breakpoint", "prefix caching is automatic in the mesh")
        if self.type == "text":
            if self.text is None:
                raise missing(f"{param}.text")
            extra = self.refusal is not None
            if extra:
                raise OpenAIError(
                    400, "a text part has no 'refusal'", param=f"{param}.refusal", code="unknown_parameter"
                )
            return self.text
        if self.type == "refusal" and role == "assistant" and self.refusal is not None and self.text is None:
            return self.refusal
        if self.type == "refusal":
            raise OpenAIError(
                400,
                "a refusal part is an assistant's, with 'refusal' text only",
                param=param,
                code="invalid_value",
            )
        raise refused(f"{param}.type", f"{self.type} content is not supported (text only)")


class FunctionCall(Strict):
    """The function of a tool call."""

    name: FunctionName
    arguments: Text = Field(description="The arguments as JSON text.")


class ToolCallParam(Strict):
    """A tool call of an earlier assistant message."""

    id: Text = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Strict):
    """One chat message."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: StrictStr | list[TextPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCallParam] | None = Field(default=None, description="Assistant messages only.")
    tool_call_id: Text | None = Field(default=None, description="Tool messages only: the call answered.")
    refusal: StrictStr | None = Field(default=None, description="Assistant messages only.")
    function_call: AnyJson = Field(default=None, description="Refused (legacy): use tool_calls.")
    audio: AnyJson = Field(default=None, description="Refused: audio is not supported.")
    annotations: AnyJson = Field(
        default=None,
        description="Assistant messages only, as a reply carried them (a client echoing a reply back): "
        "null or empty; the mesh's replies carry none, so others are refused.",
    )

    def text(self, param: str = "content") -> str:
        """The content's text (a 400 naming ``param`` for parts the mesh refuses)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text_of(f"{param}[{i}]", self.role) for i, part in enumerate(self.content))

    def to_proto(self, param: str, content_param: str | None = None) -> common_pb2.ChatMessage:
        """The contract's message; a 400 naming the field under ``param`` that
        is refused or missing (its content named ``content_param``, by
        default ``<param>.content``)."""
        content_param = content_param or f"{param}.content"
        if self.role == "function":
            raise refused(f"{param}.role", "the legacy 'function' role is not supported; use 'tool'")
        for field, value in (("function_call", self.function_call), ("audio", self.audio)):
            if value is not None:
                raise refused(
                    f"{param}.{field}",
                    "not supported" + ("; use tool_calls" if field == "function_call" else ""),
                )
        assistant = self.role == "assistant"
        # A reply echoed back (messages.append(msg.model_dump())) carries annotations: null.
        if self.annotations not in (None, []):
            if not assistant:
                raise OpenAIError(
                    400,
                    f"{self.role} messages have no 'annotations'",
                    param=f"{param}.annotations",
                    code="unknown_parameter",
                )
            raise refused(f"{param}.annotations", "url citations are not sent to the model; drop them")
        for field, value, allowed in (
            ("tool_calls", self.tool_calls, assistant),
            ("refusal", self.refusal, assistant),
            ("tool_call_id", self.tool_call_id, self.role == "tool"),
        ):
            if value is not None and not allowed:
                raise OpenAIError(
                    400,
                    f"{self.role} messages have no '{field}'",
                    param=f"{param}.{field}",
                    code="unknown_parameter",
                )
        if self.role == "tool" and not self.tool_call_id:
            raise missing(f"{param}.tool_call_id")
        if self.content is None and not assistant:
            raise missing(content_param)
        text = self.text(content_param)
        if not text and self.refusal:
            text = self.refusal
        _check_encodable(text, content_param)
        message = common_pb2.ChatMessage(
            role=_ROLE[self.role], content=text, name=self.name or "", tool_call_id=self.tool_call_id or ""
        )
        for call in self.tool_calls or ():
            message.tool_calls.add(id=call.id, name=call.function.name, arguments=call.function.arguments)
        return message


def _check_encodable(text: str, param: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise OpenAIError(400, f"{param} is not valid UTF-8 text", param=param, code="invalid_value") from exc


def chat_messages(messages: list[Message], param: str = "messages") -> list[common_pb2.ChatMessage]:
    """The contract's messages; a 400 names the first field refused, missing or not valid UTF-8."""
    return [m.to_proto(f"{param}[{i}]") for i, m in enumerate(messages)]
