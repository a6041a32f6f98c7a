"""Checks on a turn's input before any engine work."""

from __future__ import annotations

from llmmesh.errors import InvalidArgument, Reason
from llmmesh.v1 import chat_service_pb2, common_pb2

_ROLES = {
    common_pb2.CHAT_ROLE_SYSTEM,
    common_pb2.CHAT_ROLE_USER,
    common_pb2.CHAT_ROLE_ASSISTANT,
    common_pb2.CHAT_ROLE_DEVELOPER,
    common_pb2.CHAT_ROLE_TOOL,
}


def validate_start(start: chat_service_pb2.ChatStart, max_messages: int, max_message_chars: int) -> None:
    """Raise InvalidArgument (with ``param``) for a malformed turn."""
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
    if not any(m.content.strip() for m in start.messages):
        raise InvalidArgument(Reason.EMPTY_PROMPT, "every message is empty", metadata={"param": "messages"})
    sampling = start.sampling
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
