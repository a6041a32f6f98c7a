"""The one boundary between the gRPC servicer and an engine (vLLM or the
simulator): :class:`EngineBackend` and the plain dataclasses it speaks.

The servicer knows this module and nothing below it; backends know nothing of
protobuf or gRPC. Errors cross the boundary as :class:`llmmesh.core.errors.MeshError`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from prometheus_client import CollectorRegistry

from llmmesh.core.chat_tokenizer import TokenizerSpec
from llmmesh.engine.gpu import GpuTelemetry
from llmmesh.engine.kv_events import KvEventBatch


class FinishReason(StrEnum):
    """Why a generation ended (the engine's subset of the proto enum)."""

    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    TOOL_CALLS = "tool_calls"


class HealthState(StrEnum):
    """How the backend sees itself."""

    SERVING = "serving"
    DOWN = "down"


@dataclass(frozen=True)
class ChatTurn:
    """One chat message to render with the model's chat template."""

    role: str
    content: str


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call. ``parameters_json`` is its parameters'
    JSON Schema as JSON text; empty means it takes no parameters."""

    name: str
    description: str = ""
    parameters_json: str = ""
    strict: bool = False


class ToolChoiceMode(StrEnum):
    """Whether and which tool the model must call."""

    NONE = "none"
    AUTO = "auto"
    REQUIRED = "required"
    NAMED = "named"


@dataclass(frozen=True)
class ToolChoiceSpec:
    """A request's tool choice; ``name`` is the function with ``NAMED`` and
    empty otherwise. The wire's unspecified choice arrives here already
    resolved: ``AUTO`` when tools are given, ``NONE`` otherwise."""

    mode: ToolChoiceMode = ToolChoiceMode.NONE
    name: str = ""


class ResponseFormatType(StrEnum):
    """The shape of the reply's text."""

    TEXT = "text"
    JSON_OBJECT = "json_object"
    JSON_SCHEMA = "json_schema"


@dataclass(frozen=True)
class ResponseFormatSpec:
    """A request's response format; ``schema_json`` (JSON text) and
    ``schema_name`` are set with ``JSON_SCHEMA`` only."""

    type: ResponseFormatType
    schema_name: str = ""
    schema_json: str = ""
    strict: bool = False


@dataclass(frozen=True)
class SamplingOptions:
    """Sampling parameters; ``None`` takes the engine's default.

    ``logit_bias`` pairs (token id, bias) sorted by token id; ``top_logprobs``
    is meaningful only with ``logprobs``. ``tools`` with ``tool_choice``
    other than ``NONE`` may make the reply tool calls
    (:class:`ToolCallPart`); ``response_format`` JSON shapes the content.
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoiceSpec = field(default_factory=ToolChoiceSpec)
    parallel_tool_calls: bool = True
    response_format: ResponseFormatSpec | None = None

    @property
    def guided(self) -> bool:
        """True when the output must follow a grammar: a JSON response
        format, or a tool choice of ``REQUIRED`` or ``NAMED``."""
        if self.tool_choice.mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.NAMED):
            return True
        return self.response_format is not None and self.response_format.type != ResponseFormatType.TEXT


@dataclass(frozen=True)
class KvTransferSpec:
    """A prompt's KV cache computed by a prefill pod, for a decode pod to take
    (disaggregated serving; the proto's ``KvTransfer``). ``cached_prompt_tokens``
    are the prefill pod's own prefix-cache hits, what the turn is billed as
    cached; ``params_json`` is an engine's own transfer parameters (vLLM's
    ``kv_transfer_params``), empty for the simulator."""

    source_pod_id: str
    source_request_id: str
    prompt_tokens: int
    blocks: int
    cached_prompt_tokens: int = 0
    params_json: str = ""


@dataclass(frozen=True)
class GenerationRequest:
    """One generation. ``resume_output_token_ids`` are output tokens produced
    elsewhere (a continuation after failover): they extend the prompt, count
    against ``max_tokens``, and the output continues at their offset."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    priority: int = 0
    resume_output_token_ids: tuple[int, ...] = ()
    # Disaggregated serving: compute the context's KV cache and finish with
    # a handle (GenerationFinished.kv_transfer), producing no output...
    prefill_only: bool = False
    # ...or take the context's KV cache from the prefill pod, then decode.
    kv_transfer: KvTransferSpec | None = None

    @property
    def context_token_ids(self) -> tuple[int, ...]:
        """What the engine prefills: the prompt, then the resumed output."""
        return self.prompt_token_ids + self.resume_output_token_ids


@dataclass(frozen=True)
class GenerationStarted:
    """The request was admitted to a batch; the first event, unless the
    request was cancelled while still waiting."""

    prompt_tokens: int
    cached_prompt_tokens: int


@dataclass(frozen=True)
class ToolCallPart:
    """A part of a tool call as it streams. The first part of call ``index``
    (0 for the reply's first call) carries ``id`` and ``name``; later parts of
    the same index carry more of the arguments' JSON text. Concatenating a
    call's ``arguments`` gives its arguments as a JSON object's text."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True)
class TopLogprob:
    """One of the likeliest tokens at a position."""

    token_id: int
    token: str
    logprob: float
    token_bytes: bytes


@dataclass(frozen=True)
class TokenLogprobs:
    """The log probability of one output token and, with ``top_logprobs``,
    the likeliest tokens at its position, most likely first."""

    token_id: int
    token: str
    logprob: float
    token_bytes: bytes
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class GeneratedTokens:
    """New output tokens. ``text`` may lag the tokens while a stop sequence
    could still be forming; the lag is flushed before the finish event.

    ``text`` is the reply's content only: the text of tokens that make tool
    calls arrives as ``tool_calls`` parts instead. ``logprobs`` has one entry
    per token of ``token_ids`` when the request asked for logprobs, and is
    empty otherwise."""

    token_ids: tuple[int, ...]
    text: str
    output_token_offset: int
    tool_calls: tuple[ToolCallPart, ...] = ()
    logprobs: tuple[TokenLogprobs, ...] = ()


@dataclass(frozen=True)
class GenerationFinished:
    """The last event of every generation, cancelled ones included."""

    reason: FinishReason
    prompt_tokens: int
    output_tokens: int
    cached_prompt_tokens: int
    matched_stop: str = ""
    # Set when a prefill_only generation finished.
    kv_transfer: KvTransferSpec | None = None


GenerationEvent = GenerationStarted | GeneratedTokens | GenerationFinished


@dataclass(frozen=True)
class EngineInfo:
    """What a pod serves and how big it is."""

    pod_id: str
    instance_id: str
    backend: str
    model: str
    context_window: int
    block_size: int
    max_num_seqs: int
    kv_blocks_total: int
    vocab_size: int
    # Disaggregated serving: "both", "prefill" or "decode".
    role: str = "both"


@dataclass(frozen=True)
class LoadSnapshot:
    """The load at one moment; counters are totals since start."""

    running: int
    waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    gpu: GpuTelemetry
    health: HealthState


class EngineBackend(ABC):
    """An engine: continuous batching, paged KV cache, prefix caching, priority.

    Lifecycle: :meth:`start` before anything else, :meth:`close` once at the end.
    """

    @abstractmethod
    async def start(self) -> None:
        """Start the engine loop."""

    @abstractmethod
    async def close(self) -> None:
        """Stop the engine loop and end every generation and event stream."""

    @abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        """Run one generation: :class:`GenerationStarted` on admission, then
        :class:`GeneratedTokens`, then exactly one :class:`GenerationFinished`
        unless it fails.

        Errors (a duplicate running ``request_id``, a request that can never
        fit) are raised as ``MeshError`` from the first ``__anext__``. An
        engine that fails mid-generation raises a ``MeshError`` (UNAVAILABLE,
        ``ENGINE_FAILED``) from a later ``__anext__`` instead of finishing:
        the tokens already yielded stand, and a retry may resume from them. Closing
        the generator early (``aclose``) aborts the request. A request
        cancelled while still waiting finishes without ``GenerationStarted``.
        """

    @abstractmethod
    async def abort(self, request_id: str) -> bool:
        """Abort a running or waiting generation; its stream then finishes with
        ``CANCELLED`` and the usage so far. False when no such request runs."""

    @abstractmethod
    async def tokenize(self, prompt: str | Sequence[ChatTurn], add_generation_prompt: bool) -> list[int]:
        """Token ids of plain text or of chat turns rendered with the chat
        template, exactly as a generation would see them."""

    def tokenizer_spec(self) -> TokenizerSpec | None:
        """The tokenizer and chat template as data a client can run to get
        exactly :meth:`tokenize`'s ids for chat turns, or None when the
        backend cannot describe them (clients then call :meth:`tokenize`)."""
        return None

    @abstractmethod
    def info(self) -> EngineInfo:
        """The pod's description; ``instance_id`` changes with every process."""

    @abstractmethod
    def load(self) -> LoadSnapshot:
        """The current load."""

    @abstractmethod
    def kv_events(self, after_sequence: int) -> AsyncIterator[KvEventBatch]:
        """Retained KV-cache events after ``after_sequence``, then live ones,
        in batches. A batch has ``gap=True`` when events the subscriber had not
        seen were dropped: it must forget the pod's blocks and rebuild."""

    @abstractmethod
    def prometheus_registry(self) -> CollectorRegistry:
        """The registry whose metrics the pod's ``/metrics`` serves, named as
        vLLM names them (``vllm:time_to_first_token_seconds``, …)."""
