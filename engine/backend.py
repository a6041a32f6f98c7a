"""The one boundary between the gRPC servicer and an engine (vLLM or the
simulator): :class:`EngineBackend` and the plain dataclasses it speaks.

The servicer knows this module and nothing below it; backends know nothing of
protobuf or gRPC. Errors cross the boundary as :class:`llmmesh.errors.MeshError`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from prometheus_client import CollectorRegistry

from engine.gpu import GpuTelemetry
from engine.kv_events import KvEventBatch
from llmmesh.chat_tokenizer import TokenizerSpec


class FinishReason(StrEnum):
    """Why a generation ended (the engine's subset of the proto enum)."""

    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"


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
class SamplingOptions:
    """Sampling parameters; ``None`` takes the engine's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False


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
class GeneratedTokens:
    """New output tokens. ``text`` may lag the tokens while a stop sequence
    could still be forming; the lag is flushed before the finish event."""

    token_ids: tuple[int, ...]
    text: str
    output_token_offset: int


@dataclass(frozen=True)
class GenerationFinished:
    """The last event of every generation, cancelled ones included."""

    reason: FinishReason
    prompt_tokens: int
    output_tokens: int
    cached_prompt_tokens: int
    matched_stop: str = ""


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
