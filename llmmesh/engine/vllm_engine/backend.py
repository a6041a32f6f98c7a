"""vLLM's ``AsyncLLM`` behind :class:`engine.backend.EngineBackend`.

One ``AsyncLLM`` per pod, with prefix caching on, ``scheduling_policy=
"priority"`` (the request's priority goes straight through: lower runs
first, vLLM's convention) and KV-cache events published over ZMQ, which
:class:`KvEventRelay` puts on the pod's feed. Output streams in
``DELTA`` mode. Cancelling (``abort``) or closing a generation aborts the
vLLM request, which frees its batch slot and blocks at the next step.

Sampling options map to vLLM's ``SamplingParams`` in
:mod:`engine.vllm_engine.sampling` (guided decoding for tool choices and
JSON response formats included), and :mod:`engine.vllm_engine.replies`
splits the output into content, tool-call parts and logprobs.

vLLM reports its load per engine step; an idle engine sends no more
reports, so ``running`` and ``waiting`` are capped by the generations this
pod still has open, and an aborted request stops counting at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import vllm
from prometheus_client import REGISTRY, CollectorRegistry
from vllm import SamplingParams
from vllm.config.kv_events import KVEventsConfig
from vllm.config.kv_transfer import KVTransferConfig
from vllm.config.structured_outputs import StructuredOutputsConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import VLLMValidationError
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError

from llmmesh.core.chat_tokenizer import HfTokenizerSpec
from llmmesh.core.errors import AlreadyExists, InvalidArgument, MeshError, Reason, Unavailable
from llmmesh.core.tasks import cancel_and_wait
from llmmesh.engine.backend import (
    ChatTurn,
    EngineBackend,
    EngineInfo,
    FinishReason,
    GenerationEvent,
    GenerationFinished,
    GenerationRequest,
    GenerationStarted,
    HealthState,
    LoadSnapshot,
    SamplingOptions,
    ToolChoiceMode,
)
from llmmesh.engine.gpu import GpuCollector, NvmlProbe
from llmmesh.engine.kv_events import KvEventBatch, KvEventLog
from llmmesh.engine.settings import EngineSettings
from llmmesh.engine.vllm_engine import features, resumed_grammar
from llmmesh.engine.vllm_engine.auto_tools import AutoToolCalls, refuse_auto, tool_parser_for_template
from llmmesh.engine.vllm_engine.config import VllmEngineConfig
from llmmesh.engine.vllm_engine.kv_relay import KvEventRelay
from llmmesh.engine.vllm_engine.logprobs import TokenBytes
from llmmesh.engine.vllm_engine.replies import ReplyStream
from llmmesh.engine.vllm_engine.sampling import guided_param, sampling_params
from llmmesh.engine.vllm_engine.stats import LoadRecorder, SchedulerLoad
from llmmesh.engine.vllm_engine.tokenizer_spec import hf_tokenizer_spec

log = logging.getLogger(__name__)

KV_EVENT_TOPIC = "kv"


class VllmBackend(EngineBackend):
    """A vLLM engine (``vllm.v1.engine.async_llm.AsyncLLM``) for one model."""

    def __init__(self, settings: EngineSettings, model_path: Path) -> None:
        self._settings = settings
        self.config = VllmEngineConfig.from_settings(settings, model_path)
        self.kv_event_log = KvEventLog(settings.kv_event_retention)
        self._llm: AsyncLLM | None = None
        self._tokenizer: Any = None
        self._tokenizer_spec: HfTokenizerSpec | None = None
        self._relay: KvEventRelay | None = None
        self._relay_task: asyncio.Task[None] | None = None
        self._open: set[str] = set()
        self._gpu = NvmlProbe()
        self._gpu_collector = GpuCollector(self._gpu)
        self._info: EngineInfo | None = None
        self._instance_id = secrets.token_hex(8)
        self._socket_dir: str | None = None
        self._load = SchedulerLoad()
        self._tool_parser: str | None = None
        self._token_bytes_table: TokenBytes | None = None

    async def start(self) -> None:
        """Start vLLM's engine core (a child process; tens of seconds on CPU)."""
        if self._llm is not None:
            return
        # The engine core process inherits these.
        for name, value in self.config.environment().items():
            os.environ.setdefault(name, value)
        # IPC sockets: vLLM binds them (it would connect to a tcp host:port),
        # and they never leave the machine.
        self._socket_dir = tempfile.mkdtemp(prefix="llmmesh-kv-")
        endpoint = f"ipc://{self._socket_dir}/events"
        replay_endpoint = f"ipc://{self._socket_dir}/replay"
        kwargs = self.config.engine_kwargs()
        # AsyncEngineArgs, unlike LLM, takes this config only as its class.
        kwargs["structured_outputs_config"] = StructuredOutputsConfig(**kwargs["structured_outputs_config"])
        if "kv_transfer_config" in kwargs:
            kwargs["kv_transfer_config"] = KVTransferConfig(**kwargs["kv_transfer_config"])
        # vLLM loads no custom logits processor when speculating; the
        # requests that need it are refused (features.refuse_when_speculating).
        processors = [] if self.config.speculating else [resumed_grammar.QUALIFIED_NAME]
        args = AsyncEngineArgs(
            **kwargs,
            logits_processors=processors,
            kv_events_config=KVEventsConfig(
                enable_kv_cache_events=True,
                publisher="zmq",
                endpoint=endpoint,
                replay_endpoint=replay_endpoint,
                topic=KV_EVENT_TOPIC,
            ),
        )
        self._llm = AsyncLLM.from_engine_args(args, stat_loggers=[LoadRecorder.factory(self._load)])
        self._tokenizer = self._llm.get_tokenizer()
        self._tool_parser = tool_parser_for_template(getattr(self._tokenizer, "chat_template", None))
        self._relay = KvEventRelay(endpoint, replay_endpoint, KV_EVENT_TOPIC, self.kv_event_log)
        self._relay_task = asyncio.create_task(self._relay.run(), name="vllm-kv-event-relay")
        # vLLM's metrics live in the process-wide registry; the GPUs beside them.
        REGISTRY.register(self._gpu_collector)
        vllm_config = self._llm.vllm_config
        self._info = EngineInfo(
            pod_id=self._settings.pod_id,
            instance_id=self._instance_id,
            backend="vllm",
            model=self._settings.model,
            context_window=vllm_config.model_config.max_model_len,
            block_size=vllm_config.cache_config.block_size,
            max_num_seqs=vllm_config.scheduler_config.max_num_seqs,
            kv_blocks_total=vllm_config.cache_config.num_gpu_blocks or 0,
            vocab_size=vllm_config.model_config.get_vocab_size(),
            role=self._settings.pod_role,
        )
        log.info(
            "vLLM %s serving %s: %d KV blocks of %d tokens",
            vllm.__version__,
            self.config.model_path,
            self._info.kv_blocks_total,
            self._info.block_size,
        )

    async def close(self) -> None:
        await cancel_and_wait(self._relay_task)
        if self._relay is not None:
            self._relay.close()
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.shutdown()
            # vLLM's __del__ shuts down again; let it run now, while the
            # interpreter is whole, not at exit.
            del llm
        self.kv_event_log.close()
        with contextlib.suppress(KeyError):  # never started
            REGISTRY.unregister(self._gpu_collector)
        self._gpu.close()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        llm = self._require_running()
        if request.request_id in self._open:
            raise AlreadyExists(
                Reason.DUPLICATE_REQUEST,
                f"request {request.request_id!r} is already running",
                metadata={"param": "request_id"},
            )
        context = list(request.context_token_ids)
        resumed = len(request.resume_output_token_ids)
        room = self.info().context_window - len(context)
        max_tokens = request.sampling.max_tokens
        limit = room if max_tokens is None else min(max_tokens - resumed, room)
        if limit <= 0:
            # A continuation already at its limit: nothing left to generate.
            yield GenerationStarted(len(context), 0)
            yield GenerationFinished(FinishReason.LENGTH, len(context), 0, 0)
            return
        params, reply = self._prepare(request, limit)
        self._open.add(request.request_id)
        finished = False
        output_tokens = 0
        cached = 0
        started = False
        try:
            stream = llm.generate(
                {"prompt_token_ids": context}, params, request.request_id, priority=request.priority
            )
            async with contextlib.aclosing(stream):
                async for output in stream:
                    completion = output.outputs[0]
                    aborted_early = output.finished and completion.finish_reason == "abort" and not started
                    if not started and not aborted_early:
                        started = True
                        cached = output.num_cached_tokens or 0
                        yield GenerationStarted(len(context), cached)
                    event = reply.tokens(
                        completion.token_ids,
                        completion.text,
                        resumed + output_tokens,
                        completion.logprobs,
                        last=output.finished and completion.finish_reason != "abort",
                    )
                    if event is not None:
                        yield event
                        output_tokens += len(event.token_ids)
                    if output.finished:
                        finished = True
                        stop = completion.stop_reason
                        matched = isinstance(stop, str)
                        yield GenerationFinished(
                            reply.finish_reason(completion.finish_reason, matched),
                            len(context),
                            output_tokens,
                            cached,
                            stop if matched else "",
                        )
        except Exception as exc:
            raise _engine_error(exc, request.sampling) from exc
        finally:
            self._open.discard(request.request_id)
            if not finished and self._llm is not None:
                await self._llm.abort(request.request_id)

    def _prepare(self, request: GenerationRequest, max_tokens: int) -> tuple[SamplingParams, ReplyStream]:
        """vLLM's parameters for ``request`` and the stream that reads its
        output; raises ``InvalidArgument`` for what this engine cannot do."""
        sampling = request.sampling
        features.refuse_disaggregation(request)
        if self.config.speculating:
            continued = bool(request.resume_output_token_ids)
            features.refuse_when_speculating(sampling, guided_param(sampling), continued)
        auto: AutoToolCalls | None = None
        if sampling.tools and sampling.tool_choice.mode == ToolChoiceMode.AUTO:
            if self._tool_parser is None:
                raise refuse_auto()
            auto = AutoToolCalls(self._tool_parser, self._tokenizer, sampling.tools)
        params = sampling_params(request, max_tokens, auto, self._control_tokens)
        token_bytes = self._token_bytes() if sampling.logprobs else None
        reply = ReplyStream(request.request_id, sampling, token_bytes, auto)
        resumed = list(request.resume_output_token_ids)
        if resumed:
            text = self._tokenizer.decode(resumed, skip_special_tokens=params.skip_special_tokens)
            reply.prime(text, resumed)
        return params, reply

    def _control_tokens(self, grammar_kind: str) -> Sequence[int]:
        """Tokens with raw control characters, which no guided reply samples:
        all of them in compact JSON; all but tab, LF and CR where the
        grammar allows whitespace or free text (a structural tag)."""
        compact = grammar_kind != "structural_tag" and self.config.compact_json
        allowed = b"" if compact else b"\t\n\r"
        return self._token_bytes().control_tokens(self.info().vocab_size, allowed)

    def _token_bytes(self) -> TokenBytes:
        # Built on the first request for logprobs or guided decoding: it
        # reads the tokenizer's decoder, which plain turns never need.
        if self._token_bytes_table is None:
            self._token_bytes_table = TokenBytes(self._tokenizer)
        return self._token_bytes_table

    async def abort(self, request_id: str) -> bool:
        if request_id not in self._open or self._llm is None:
            return False
        self._open.discard(request_id)
        await self._llm.abort(request_id)
        return True

    async def tokenize(self, prompt: str | Sequence[ChatTurn], add_generation_prompt: bool) -> list[int]:
        self._require_running()
        if isinstance(prompt, str):
            return list(self._tokenizer.encode(prompt))
        try:
            # As vLLM's chat endpoint does: render the template, then encode
            # without adding special tokens a second time.
            text = self._tokenizer.apply_chat_template(
                [{"role": turn.role, "content": turn.content} for turn in prompt],
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
            )
        except Exception as exc:  # jinja raises its own errors for bad input
            raise InvalidArgument(Reason.INVALID_REQUEST, str(exc), metadata={"param": "messages"}) from exc
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def tokenizer_spec(self) -> HfTokenizerSpec | None:
        if self._tokenizer is None:
            return None
        if self._tokenizer_spec is None:
            self._tokenizer_spec = hf_tokenizer_spec(self._tokenizer)
        return self._tokenizer_spec

    def info(self) -> EngineInfo:
        if self._info is None:
            raise Unavailable(Reason.ENGINE_UNAVAILABLE, "the vLLM engine is starting", retry_after_s=5.0)
        return self._info

    def load(self) -> LoadSnapshot:
        open_now = len(self._open)
        running = min(self._load.running, open_now)
        return LoadSnapshot(
            running=running,
            waiting=min(self._load.waiting, open_now - running),
            kv_cache_usage=self._load.kv_cache_usage if open_now else 0.0,
            prefix_cache_queries=self._load.prefix_cache_queries,
            prefix_cache_hits=self._load.prefix_cache_hits,
            gpu=self._gpu.read(),
            health=HealthState.SERVING if self._healthy() else HealthState.DOWN,
        )

    def kv_events(self, after_sequence: int) -> AsyncIterator[KvEventBatch]:
        return self.kv_event_log.follow(after_sequence)

    def prometheus_registry(self) -> CollectorRegistry:
        # vLLM's PrometheusStatLogger registers in the process-wide registry.
        return REGISTRY

    def _healthy(self) -> bool:
        return self._llm is not None and not self._llm.errored

    def _require_running(self) -> Any:
        if not self._healthy():
            raise Unavailable(Reason.ENGINE_UNAVAILABLE, "the vLLM engine is not running", retry_after_s=5.0)
        return self._llm


def _engine_error(exc: Exception, sampling: SamplingOptions) -> Exception:
    """vLLM's exceptions in the mesh's terms; ours pass through. vLLM's
    refusal of a request names the parameter it refused or, for a grammar
    its structured-output backend cannot compile, the one the grammar came
    from."""
    if isinstance(exc, MeshError):
        return exc
    if isinstance(exc, VLLMValidationError):
        param = exc.parameter or guided_param(sampling)
        metadata = {"param": param} if param else None
        return InvalidArgument(Reason.INVALID_SAMPLING, str(exc), metadata=metadata)
    if isinstance(exc, EngineDeadError):
        return Unavailable(Reason.ENGINE_FAILED, "the vLLM engine died", retry_after_s=5.0)
    if isinstance(exc, ValueError):
        return InvalidArgument(Reason.INVALID_REQUEST, str(exc))
    return Unavailable(Reason.ENGINE_FAILED, f"the vLLM engine failed: {exc}", retry_after_s=1.0)
