"""One chat turn's state in the gateway: what it will run, what it delivered.

:class:`PreparedTurn` is a validated turn as the engine will see it;
:class:`TurnMeter` counts what reached the caller (the billed output) and
keeps the reply for the zone store; :class:`Turn` ties them to the caller,
its admission and its acceptance in the zone store.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from llmmesh.core.hop_timing import HopStamps
from llmmesh.region.admission.control import Admitted
from llmmesh.region.metrics import TurnLatency
from llmmesh.region.policy_cache import Caller
from llmmesh.region.turn.conversation_context import ConversationContext
from llmmesh.region.turn.filtered_output import Release
from llmmesh.region.turn.tool_calls import ToolCallLog
from llmmesh.region.zone_store.rows import AcceptedTurn, ToolCallRow, ToolResult
from llmmesh.v1 import chat_service_pb2, common_pb2, model_registry_service_pb2


@dataclass
class TurnMeter:
    """Token counts of one turn as they accrue. ``output_tokens`` counts
    what was delivered to the caller, which is what is billed;
    ``carried_tokens`` and ``carried_text`` are what a continued turn's
    client had before (another region delivered them).
    ``delivered_token_ids`` are the tokens this region delivered; when a pod
    fails mid-stream, the next pod of the region is given them after the
    carried ones (``resumed_tokens`` of them) and goes on from there."""

    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    started: bool = False
    reason: common_pb2.FinishReason.ValueType = common_pb2.FINISH_REASON_UNSPECIFIED
    # The reply as delivered, for the zone store.
    text_parts: list[str] = field(default_factory=list)
    sequence: int = 0
    carried_tokens: int = 0
    carried_text: str = ""
    # The reply's tool calls, the carried ones (a continuation's) included.
    tool_calls: ToolCallLog = field(default_factory=ToolCallLog)
    # Times the delivered tokens for the region's TTFT and ITL histograms.
    latency: TurnLatency | None = None
    delivered_token_ids: list[int] = field(default_factory=list)
    # Delivered tokens the current pod was given as context (it took the turn over mid-stream).
    resumed_tokens: int = 0

    @property
    def resumed_context(self) -> int:
        """Output tokens the current pod prefills after the prompt: a
        continuation's carried ones, then those this region delivered
        before the pod took the turn over."""
        return self.carried_tokens + self.resumed_tokens

    def prompt(self, prompt_tokens: int, cached_tokens: int) -> None:
        """Take the engine's prompt counts; a pod prefills the turn's resumed
        output tokens after the prompt, and those are output, not input."""
        self.input_tokens = max(0, prompt_tokens - self.resumed_context)
        self.cached_input_tokens = min(cached_tokens, self.input_tokens)

    def take_over(self) -> None:
        """Another pod goes on with the turn from what was delivered."""
        self.resumed_tokens = len(self.delivered_token_ids)

    def usage(self) -> common_pb2.TokenUsage:
        """The whole turn's usage, as its client sees it."""
        return common_pb2.TokenUsage(
            input_tokens=self.input_tokens,
            output_tokens=self.carried_tokens + self.output_tokens,
            cached_input_tokens=self.cached_input_tokens,
        )

    def reply_text(self) -> str:
        return self.carried_text + "".join(self.text_parts)

    def reply_tool_calls(self) -> tuple[ToolCallRow, ...]:
        """The reply's tool calls as the zone store keeps them."""
        return tuple(ToolCallRow(c.id, c.name, c.arguments) for c in self.tool_calls.calls())

    def deliver(self, base_sequence: int, release: Release) -> chat_service_pb2.ChatResponse:
        """A delta for the caller, counted as delivered (and billed) here:
        its tokens, tool-call tokens included, are output tokens."""
        self.sequence += 1
        self.output_tokens += len(release.token_ids)
        self.delivered_token_ids.extend(release.token_ids)
        self.text_parts.append(release.text)
        self.tool_calls.add(release.tool_calls)
        if self.latency is not None:
            self.latency.delivered(len(release.token_ids))
        # Filled in place, empty fields left alone: a turn sends one of these per token.
        response = chat_service_pb2.ChatResponse()
        delta = response.delta
        delta.SetInParent()
        delta.sequence = base_sequence + self.sequence
        delta.text = release.text
        delta.token_ids.extend(release.token_ids)
        if release.tool_calls:
            delta.tool_calls.extend(release.tool_calls)
        if release.logprobs:
            delta.logprobs.extend(release.logprobs)
        return response


@dataclass(frozen=True)
class PreparedTurn:
    """A validated turn, ready for admission: what the engine will see."""

    request_id: str
    model: model_registry_service_pb2.Model
    messages: tuple[common_pb2.ChatMessage, ...]
    token_ids: tuple[int, ...]
    # The most output tokens the turn may produce (for TPM and quota).
    max_output_tokens: int
    conversation_id: str | None
    # The new user text stored with the reply, for conversation turns.
    user_text: str | None
    # The original request id of a continued turn (None for a turn of its own).
    continues: str | None = None
    # The tool messages stored with the reply, for conversation turns.
    tool_results: tuple[ToolResult, ...] = ()
    # The end user the tenant named (OpenAI's `user`), logged and billed with the turn; "" if none.
    end_user: str = ""
    # A conversation turn's place in the conversation's tree and how its history was fitted.
    context: ConversationContext | None = None

    @property
    def parent_id(self) -> str | None:
        """The message a conversation turn's first new message follows (None: the newest one)."""
        return self.context.parent_id if self.context else None

    @property
    def original_request_id(self) -> str:
        """The request id the turn began under, whichever attempt this is (tool call ids derive from it)."""
        return self.continues or self.request_id


@dataclass
class Turn:
    """One running turn's state across attempts and its ending."""

    caller: Caller
    prepared: PreparedTurn
    admitted: Admitted
    # This acceptance of the request id, and what the zone knew of the turn.
    holder: str
    accepted: AcceptedTurn
    # The zone store's acceptance still running beside the engine's first
    # token (region.turn.admit); None once awaited, or where it ran before.
    accepting: asyncio.Task[AcceptedTurn] | None = None
    meter: TurnMeter = field(default_factory=TurnMeter)
    record: asyncio.Task[str] | None = None
    # The turn's way to its first token (region.metrics.HOPS); None: not timed.
    hops: HopStamps | None = None
