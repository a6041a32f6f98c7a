"""The simulator behind :class:`engine.backend.EngineBackend`."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from prometheus_client import CollectorRegistry

from llmmesh.core.chat_tokenizer import TokenizerSpec
from llmmesh.core.errors import InvalidArgument, MeshError, Reason, Unavailable
from llmmesh.core.tasks import cancel_and_wait
from llmmesh.engine.backend import (
    ChatTurn,
    EngineBackend,
    EngineInfo,
    GenerationEvent,
    GenerationFinished,
    GenerationRequest,
    HealthState,
    LoadSnapshot,
)
from llmmesh.engine.gpu import GpuCollector, NvmlProbe
from llmmesh.engine.kv_events import KvEventBatch, KvEventLog
from llmmesh.engine.settings import EngineSettings
from llmmesh.engine.sim.disaggregation import (
    KvReceiver,
    KvTransferModel,
    decode_events,
    prefill_events,
    prefill_request,
)
from llmmesh.engine.sim.faults import CrashCallback, FaultPlan
from llmmesh.engine.sim.kv_blocks import KvBlockPool
from llmmesh.engine.sim.metrics import SimStepsCollector
from llmmesh.engine.sim.model_tokenizer import PromptTokenizer, prompt_tokenizer_of
from llmmesh.engine.sim.sampler import DeterministicSampler
from llmmesh.engine.sim.scheduler import ContinuousBatchScheduler
from llmmesh.engine.sim.sequence import SimSequence
from llmmesh.engine.sim.timing import SimTimingModel
from llmmesh.engine.sim.tokenizer import SimTokenizer
from llmmesh.engine.sim.vocabulary import BYTE_OFFSET


class SimBackend(EngineBackend):
    """A simulated vLLM engine with one scheduler task.

    With ``model_path`` set it tokenizes prompts with that model's tokenizer
    (:mod:`engine.sim.model_tokenizer`), so its counts are the model's.

    The ``sim_*`` fault settings inject failures (:mod:`engine.sim.faults`);
    ``on_crash`` is what the crash fault calls, required when it is set.
    ``gpu`` reads the GPUs the pod reports (NVML by default; a pod in a
    virtual-time run passes one that reads none, so no machine's GPUs
    reach its load reports).
    """

    def __init__(
        self, settings: EngineSettings, on_crash: CrashCallback | None = None, *, gpu: NvmlProbe | None = None
    ) -> None:
        self._settings = settings
        self.faults = FaultPlan.from_settings(settings, on_crash)
        self.tokenizer = SimTokenizer()
        # The served model's tokenizer reads prompts when the pod has one
        # (engine.sim.model_tokenizer); the simulator's pieces write replies.
        model_prompts = prompt_tokenizer_of(settings.model_path)
        self.prompts: PromptTokenizer = model_prompts or self.tokenizer
        self.kv_event_log = KvEventLog(settings.kv_event_retention)
        self.pool = KvBlockPool(settings.kv_blocks, settings.block_size, self.kv_event_log)
        self.timing = SimTimingModel(
            prefill_overhead_s=settings.sim_prefill_overhead_s,
            prefill_per_token_s=settings.sim_prefill_per_token_s,
            inter_token_s=settings.sim_inter_token_s,
            batch_load_factor=settings.sim_batch_load_factor,
            max_num_seqs=settings.max_num_seqs,
        )
        self.scheduler = ContinuousBatchScheduler(
            self.pool,
            self.timing,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            model_name=settings.model,
            faults=self.faults,
        )
        self._sampler = DeterministicSampler(self.tokenizer)
        self._arrivals = itertools.count()
        self._gpu = gpu or NvmlProbe()
        self.scheduler.metrics.registry.register(GpuCollector(self._gpu))
        self.scheduler.metrics.registry.register(SimStepsCollector(self.scheduler.stats))
        self._task: asyncio.Task[None] | None = None
        self._info = EngineInfo(
            pod_id=settings.pod_id,
            instance_id=secrets.token_hex(8),
            backend="sim",
            model=settings.model,
            context_window=settings.context_window,
            block_size=settings.block_size,
            max_num_seqs=settings.max_num_seqs,
            kv_blocks_total=settings.kv_blocks,
            # Prompt ids are the model's, reply ids the simulator's: both must validate.
            vocab_size=max(self.prompts.vocab_size, self.tokenizer.vocab_size),
            role=settings.pod_role,
        )
        self.transfers = KvTransferModel(
            settings.sim_kv_transfer_overhead_s, settings.sim_kv_transfer_per_block_s
        )
        self.receiver = KvReceiver(
            self.transfers,
            self.pool,
            lambda: self.scheduler.running + self.scheduler.waiting < settings.max_num_seqs,
            settings.sim_inter_token_s,
        )

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.scheduler.run(), name=f"sim-engine-{self._settings.pod_id}")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self.scheduler.close()
        self.kv_event_log.close()
        self._gpu.close()

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        """A generation, or a disaggregated phase of one
        (:mod:`engine.sim.disaggregation`)."""
        if request.prefill_only:
            async with contextlib.aclosing(self._generate(prefill_request(request))) as events:
                async for event in prefill_events(events, request, self._info.pod_id, self.pool):
                    yield event
            return
        spec = request.kv_transfer
        if spec is None:
            async with contextlib.aclosing(self._generate(request)) as events:
                async for event in events:
                    yield event
            return
        self._require_running()
        pinned = await self.receiver.receive(request)
        async with contextlib.aclosing(
            decode_events(self._generate(request), self.pool, pinned, spec)
        ) as events:
            async for event in events:
                yield event

    def _require_running(self) -> None:
        if self._task is None or self._task.done():
            raise Unavailable(
                Reason.ENGINE_UNAVAILABLE, "the simulated engine is not running", retry_after_s=1.0
            )

    async def _generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        if self._task is None or self._task.done():
            raise Unavailable(
                Reason.ENGINE_UNAVAILABLE, "the simulated engine is not running", retry_after_s=1.0
            )
        favoured = [
            token_id for token_id, bias in request.sampling.logit_bias if bias > 0 and token_id < BYTE_OFFSET
        ]
        if favoured:
            # Replies end by their planned length, not by sampling </s>, and
            # role markers have no place inside one: the model cannot favour them.
            raise InvalidArgument(
                Reason.INVALID_SAMPLING,
                f"the simulator cannot favour special token {favoured[0]} with a positive logit_bias",
                metadata={"param": "logit_bias"},
            )
        sequence = SimSequence(
            request,
            next(self._arrivals),
            sampler=self._sampler,
            tokenizer=self.tokenizer,
            context_window=self._settings.context_window,
            faults=self.faults,
            prompts=self.prompts,
        )
        # Blocks are taken as the reply grows, so only the prompt and the KV
        # slot of the first output token must fit; a reply that outgrows the
        # pool later ends with LENGTH (see engine.sim.scheduler).
        needed = self.pool.blocks_for(sequence.prompt_tokens + 1)
        if needed > self.pool.total_blocks:
            raise InvalidArgument(
                Reason.PROMPT_TOO_LONG,
                f"the prompt needs {needed} KV blocks; the pod has {self.pool.total_blocks}",
                metadata={"param": "prompt"},
            )
        self.scheduler.submit(sequence)
        finished = False
        try:
            while not finished:
                event = await sequence.events.get()
                if isinstance(event, MeshError):
                    finished = True  # it already left the batch
                    raise event
                finished = isinstance(event, GenerationFinished)
                yield event
        finally:
            if not finished:
                self.scheduler.abort(request.request_id)

    async def abort(self, request_id: str) -> bool:
        return self.scheduler.abort(request_id)

    async def tokenize(self, prompt: str | Sequence[ChatTurn], add_generation_prompt: bool) -> list[int]:
        if isinstance(prompt, str):
            return self.prompts.encode_prompt(prompt)
        try:
            return self.prompts.render_chat(
                ((turn.role, turn.content) for turn in prompt), add_generation_prompt
            )
        except ValueError as exc:
            raise InvalidArgument(Reason.INVALID_REQUEST, str(exc), metadata={"param": "messages"}) from exc

    def tokenizer_spec(self) -> TokenizerSpec:
        return self.prompts.spec

    def info(self) -> EngineInfo:
        return self._info

    def load(self) -> LoadSnapshot:
        alive = self._task is not None and not self._task.done()
        stats = self.scheduler.stats()
        return LoadSnapshot(
            running=stats.running,
            waiting=stats.waiting,
            kv_cache_usage=stats.kv_cache_usage,
            prefix_cache_queries=stats.prefix_cache_queries,
            prefix_cache_hits=stats.prefix_cache_hits,
            gpu=self._gpu.read(),
            health=HealthState.SERVING if alive else HealthState.DOWN,
        )

    def kv_events(self, after_sequence: int) -> AsyncIterator[KvEventBatch]:
        return self.kv_event_log.follow(after_sequence)

    def prometheus_registry(self) -> CollectorRegistry:
        return self.scheduler.metrics.registry
