"""Checks on a turn's input before any engine work, and before any call
to the global plane: a malformed name never leaves the region."""

from __future__ import annotations

import re

from llmmesh.core.end_user import require_end_user
from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.region.turn.tool_validation import (
    require_answered_calls,
    validate_carried_calls,
    validate_logprobs,
    validate_tool_parts,
    validate_tools,
)
from llmmesh.v1 import chat_service_pb2, common_pb2

_ROLES = {
    common_pb2.CHAT_ROLE_SYSTEM,
    common_pb2.CHAT_ROLE_USER,
    common_pb2.CHAT_ROLE_ASSISTANT,
    common_pb2.CHAT_ROLE_DEVELOPER,
    common_pb2.CHAT_ROLE_TOOL,
}

MAX_REQUEST_ID = 128
"""The zone store's and billing's request id columns hold this many characters."""
_REQUEST_ID = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._:-]{{0,{MAX_REQUEST_ID - 1}}}$")
_REQUEST_ID_RULE = f"1 to {MAX_REQUEST_ID} letters, digits and . _ : -, the first a letter or digit"
# The model registry's rule for names; "auto" and empty pick the tier's default.
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
_MODEL_NAME_RULE = "1 to 128 letters, digits and . _ : / -, the first a letter or digit"
# More text than this per carried token cannot be what those tokens decode to.
_MAX_CHARS_PER_TOKEN = 256


def shown(text: str) -> str:
    """``text`` quoted for an error message, cut short: a status echoing a
    huge value would outgrow gRPC's metadata limit."""
    return repr(text if len(text) <= 64 else text[:64] + "...")


def require_request_id(request_id: str, param: str = "request_id") -> str:
    """``request_id`` if the stores can key a turn by it; INVALID_ARGUMENT otherwise."""
    if not _REQUEST_ID.match(request_id):
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"{shown(request_id)} cannot be a request id: an id is {_REQUEST_ID_RULE}",
            metadata={"param": param},
        )
    return request_id


def validate_start(start: chat_service_pb2.ChatStart, max_messages: int, max_message_chars: int) -> None:
    """Raise InvalidArgument (with ``param``) for a malformed turn. A
    conversation turn's tool messages are checked against its stored
    history later (:func:`region.turn.tool_validation.require_answered_calls`)."""
    if start.request_id:
        require_request_id(start.request_id)
    if start.model and not _MODEL_NAME.match(start.model):
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"{shown(start.model)} cannot be a model name: a name is {_MODEL_NAME_RULE}",
            metadata={"param": "model"},
        )
    # The end user is logged and billed with the turn: refused here if it could not be.
    require_end_user(start.user)
    if start.HasField("continuation"):
        _validate_continuation(start.continuation)
    _validate_messages(start, max_messages, max_message_chars)
    validate_tool_parts(start.messages)
    if not start.conversation_id:
        require_answered_calls((), start.messages)
    _validate_sampling(start.sampling)
    validate_tools(start.sampling)
    validate_logprobs(start.sampling)


def _validate_continuation(continuation: chat_service_pb2.Continuation) -> None:
    require_request_id(continuation.original_request_id, "continuation.original_request_id")
    carried = len(continuation.emitted_token_ids)
    # Tool-call text is the carried tokens' text too, outside emitted_text.
    calls = continuation.emitted_tool_calls
    decoded = len(continuation.emitted_text) + sum(len(c.name) + len(c.arguments) for c in calls)
    if decoded > _MAX_CHARS_PER_TOKEN * carried:
        param = "continuation.emitted_tool_calls" if calls else "continuation.emitted_text"
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"{param} is longer than {carried} tokens can decode to",
            metadata={"param": param},
        )
    validate_carried_calls(calls)
    if continuation.last_sequence < 0:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            "continuation.last_sequence must be >= 0",
            metadata={"param": "continuation.last_sequence"},
        )


def _validate_messages(start: chat_service_pb2.ChatStart, max_messages: int, max_message_chars: int) -> None:
    if start.WhichOneof("branch_point") == "regenerate_message_id":
        # A regeneration answers stored messages and brings none (region.turn.conversation_context checks).
        return
    if not start.messages:
        raise InvalidArgument(
            Reason.EMPTY_PROMPT, "messages must not be empty", metadata={"param": "messages"}
        )
    if len(start.messages) > max_messages:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"too many messages: {len(start.messages)} > {max_messages}",
            metadata={"param": "messages"},
        )
    for i, message in enumerate(start.messages):
        param = f"messages[{i}]"
        if message.role not in _ROLES:
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                f"{param}.role is missing or invalid",
                metadata={"param": f"{param}.role"},
            )
        if len(message.content) > max_message_chars:
            raise InvalidArgument(
                Reason.PROMPT_TOO_LONG,
                f"{param}.content is longer than {max_message_chars} characters",
                metadata={"param": f"{param}.content"},
            )
    if not any(m.content.strip() or m.tool_calls for m in start.messages):
        raise InvalidArgument(Reason.EMPTY_PROMPT, "every message is empty", metadata={"param": "messages"})


def _validate_sampling(sampling: common_pb2.SamplingParams) -> None:
    if sampling.HasField("max_tokens") and sampling.max_tokens <= 0:
        raise InvalidArgument(
            Reason.INVALID_SAMPLING, "max_tokens must be at least 1", metadata={"param": "max_tokens"}
        )
    if sampling.HasField("temperature") and not 0.0 <= sampling.temperature <= 2.0:
        raise InvalidArgument(
            Reason.INVALID_SAMPLING, "temperature must be between 0 and 2", metadata={"param": "temperature"}
        )
    if sampling.HasField("top_p") and not 0.0 < sampling.top_p <= 1.0:
        raise InvalidArgument(Reason.INVALID_SAMPLING, "top_p must be in (0, 1]", metadata={"param": "top_p"})
    if len(sampling.stop) > 4:
        raise InvalidArgument(
            Reason.INVALID_SAMPLING, "at most 4 stop sequences are allowed", metadata={"param": "stop"}
        )
