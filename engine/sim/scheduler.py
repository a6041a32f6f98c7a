"""vLLM-style continuous batching for the simulator.

One asyncio task runs engine steps. Each step: apply pending aborts, admit
waiting sequences in (priority, arrival) order (lower priority value first,
vLLM's convention) while a batch slot and KV blocks are free, sleep the
step's simulated time, then decode one token for every running sequence.

Simplifications, to revisit against vLLM:

- The simulator knows each reply's length up front, so a sequence reserves
  the KV blocks for its whole reply at admission. vLLM allocates blocks as
  the output grows and preempts (recomputes) the lowest-priority sequence
  when they run out; preemption is not modelled yet. A request that does
  not fit waits at the head of the queue (no later request overtakes it).
- Prefill is not chunked: an admitted prompt is prefilled in one step.

Injected faults (:mod:`engine.sim.faults`) act here: the crash trigger counts
admissions, a failed sequence leaves the batch like a finished one, and a
stalled one keeps its slot and blocks but takes no steps; when only stalled
sequences run, the loop sleeps until a submit or an abort, rather than
spinning through empty steps.
"""

from __future__ import annotations

import asyncio
import heapq

from engine.backend import FinishReason
from engine.sim.faults import FaultPlan
from engine.sim.kv_blocks import KvBlockPool
from engine.sim.sequence import SimSequence
from engine.sim.timing import SimTimingModel
from llmmesh.errors import AlreadyExists, Reason, Unavailable


class ContinuousBatchScheduler:
    """Waiting queue, running batch and the step loop (:meth:`run`)."""

    def __init__(
        self, pool: KvBlockPool, timing: SimTimingModel, max_num_seqs: int, faults: FaultPlan | None = None
    ) -> None:
        self._pool = pool
        self._faults = faults or FaultPlan()
        self._timing = timing
        self._max_num_seqs = max_num_seqs
        self._waiting: list[tuple[int, int, SimSequence]] = []
        self._waiting_ids: set[str] = set()
        self._running: dict[str, SimSequence] = {}
        self._aborts: set[str] = set()
        self._wakeup = asyncio.Event()
        self._closed = False
        # Engine steps taken and simulated time spent in them, for tests and
        # benchmarks that must not read the wall clock.
        self.steps = 0
        self.clock_s = 0.0

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

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
        heapq.heappush(self._waiting, (sequence.request.priority, sequence.arrival, sequence))
        self._waiting_ids.add(request_id)
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
            self._apply_aborts()
            admitted = self._admit()
            if all(sequence.stalled for sequence in self._running.values()):
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            step_s = self._timing.step_s(len(self._running), (s.uncached_tokens for s in admitted))
            await asyncio.sleep(step_s)
            self.steps += 1
            self.clock_s += step_s
            self._apply_aborts()
            self._decode()

    def close(self) -> None:
        """Refuse new work and end every sequence as cancelled. Call after
        the :meth:`run` task is cancelled."""
        self._closed = True
        for sequence in list(self._running.values()):
            self._release(sequence)
            sequence.finish(FinishReason.CANCELLED)
        for _, _, sequence in self._waiting:
            sequence.finish(FinishReason.CANCELLED)
        self._waiting.clear()
        self._waiting_ids.clear()

    def _apply_aborts(self) -> None:
        if not self._aborts:
            return
        aborts, self._aborts = self._aborts, set()
        for request_id in aborts:
            running = self._running.pop(request_id, None)
            if running is not None:
                self._release(running)
                running.finish(FinishReason.CANCELLED)
        cancelled = [entry for entry in self._waiting if entry[2].request_id in aborts]
        if cancelled:
            self._waiting = [entry for entry in self._waiting if entry[2].request_id not in aborts]
            heapq.heapify(self._waiting)
            for _, _, sequence in cancelled:
                self._waiting_ids.discard(sequence.request_id)
                sequence.finish(FinishReason.CANCELLED)

    def _admit(self) -> list[SimSequence]:
        admitted: list[SimSequence] = []
        while self._waiting and len(self._running) < self._max_num_seqs:
            sequence = self._waiting[0][2]
            if sequence.remaining_tokens == 0:
                self._pop_waiting()
                sequence.admit(None)
                self._faults.generation_started()
                continue
            allocation = self._pool.allocate(
                sequence.token_ids, sequence.prompt_tokens + sequence.remaining_tokens
            )
            if allocation is None:
                break
            self._pop_waiting()
            sequence.admit(allocation)
            self._running[sequence.request_id] = sequence
            admitted.append(sequence)
            self._faults.generation_started()
        return admitted

    def _pop_waiting(self) -> None:
        _, _, sequence = heapq.heappop(self._waiting)
        self._waiting_ids.discard(sequence.request_id)

    def _decode(self) -> None:
        for sequence in list(self._running.values()):
            if sequence.stalled:
                continue
            ended = sequence.decode_one()
            if sequence.allocation is not None:
                self._pool.cache_full_blocks(sequence.allocation, sequence.token_ids)
            if ended:
                del self._running[sequence.request_id]
                self._release(sequence)

    def _release(self, sequence: SimSequence) -> None:
        if sequence.allocation is not None:
            self._pool.free(sequence.allocation)
            sequence.allocation = None
