"""Failure injection for the simulator, for failover drills and fault tests.

A :class:`FaultPlan` is built once per backend from the ``sim_*`` fault
settings and consulted by the scheduler and its sequences. Three faults, all
off by default:

- **Error rate** (``sim_error_rate``): a generation fails mid-stream, as an
  engine that hits a CUDA error or loses a worker would. Whether a generation
  fails, and after how many output tokens, is a pure function of what the
  engine prefills (prompt plus resumed output) and the seed, so a test can
  predict it with :meth:`FaultPlan.failure_point` and a run reproduces it.
  The stream then ends with the error of :func:`injected_failure`
  (UNAVAILABLE, ``ENGINE_FAILED``, with RetryInfo) after the tokens sent.
- **Stall** (``sim_stall_after_tokens``): every generation stops producing
  tokens after that many of this run, as on a wedged GPU. The stream stays
  open and the sequence keeps its batch slot and KV blocks; an abort (a
  cancel message or a cancelled call) still ends it and frees both.
- **Crash** (``sim_crash_after_generations``): when that many generations
  have started (been admitted), the scheduler calls ``on_crash``. The pod
  process (:func:`engine.server.serve`) passes :func:`exit_process`, which
  exits at once with :data:`CRASH_EXIT_CODE` and no drain, as a crashed pod
  would; in-process pods pass their own callback, so a test observes the
  trigger without killing the test runner.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
from collections.abc import Callable
from typing import NoReturn

from llmmesh.core.errors import Reason, Unavailable
from llmmesh.engine.backend import GenerationRequest
from llmmesh.engine.settings import EngineSettings

log = logging.getLogger(__name__)

# EX_SOFTWARE from sysexits.h: an internal error, not a clean exit or a signal.
CRASH_EXIT_CODE = 70
# What RetryInfo suggests after an injected failure: the same as the engine's
# other UNAVAILABLE errors, so a drill exercises the ordinary retry path.
RETRY_AFTER_S = 1.0

CrashCallback = Callable[[], None]


def exit_process() -> NoReturn:
    """Exit the process at once with :data:`CRASH_EXIT_CODE`: no drain, no
    cleanup, no ``finally`` blocks, as a crashed pod would."""
    log.critical("injected crash: exiting with code %d and no drain", CRASH_EXIT_CODE)
    os._exit(CRASH_EXIT_CODE)


def injected_failure(request_id: str, output_tokens: int) -> Unavailable:
    """The error that ends a generation failed by the error rate."""
    return Unavailable(
        Reason.ENGINE_FAILED,
        f"the engine failed while generating {request_id!r} after {output_tokens} tokens (injected fault)",
        retry_after_s=RETRY_AFTER_S,
    )


class FaultPlan:
    """Which faults a simulator injects; the default plan injects none.

    ``on_crash`` is required when ``crash_after_generations`` is positive and
    is called exactly once, from the scheduler, when the generation that
    reaches the count is admitted. Raises ``ValueError`` for values outside
    the ranges :class:`engine.settings.EngineSettings` accepts.
    """

    def __init__(
        self,
        *,
        error_rate: float = 0.0,
        stall_after_tokens: int = 0,
        crash_after_generations: int = 0,
        on_crash: CrashCallback | None = None,
    ) -> None:
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate must be between 0 and 1, got {error_rate}")
        if stall_after_tokens < 0 or crash_after_generations < 0:
            raise ValueError("stall_after_tokens and crash_after_generations must not be negative")
        if crash_after_generations and on_crash is None:
            raise ValueError(
                "sim_crash_after_generations needs an on_crash callback in-process; "
                "only the pod process (llmmesh engine) exits by itself"
            )
        self.error_rate = error_rate
        self.stall_after_tokens = stall_after_tokens
        self.crash_after_generations = crash_after_generations
        self._on_crash = on_crash
        self.generations_started = 0

    @classmethod
    def from_settings(cls, settings: EngineSettings, on_crash: CrashCallback | None = None) -> FaultPlan:
        """The plan the ``sim_*`` fault settings describe."""
        return cls(
            error_rate=settings.sim_error_rate,
            stall_after_tokens=settings.sim_stall_after_tokens,
            crash_after_generations=settings.sim_crash_after_generations,
            on_crash=on_crash,
        )

    def failure_point(self, request: GenerationRequest, planned_tokens: int) -> int | None:
        """How many output tokens a generation that would produce
        ``planned_tokens`` streams before it fails, in ``[0, planned_tokens)``;
        ``None`` when it does not fail. Depends only on the request's prefilled
        tokens and seed (and the rate), so it is the same on every pod and run.
        A stop sequence that ends the reply earlier wins over the failure."""
        if self.error_rate == 0.0 or planned_tokens <= 0:
            return None
        digest = hashlib.blake2b(b"fault", digest_size=16)
        context = request.context_token_ids
        digest.update(struct.pack(f"<{len(context)}I", *context))
        seed = request.sampling.seed
        if seed is not None:
            # Unlike the sampler, the seed counts even for greedy decoding, so
            # a drill can vary the failing subset without changing prompts.
            digest.update(b"seed" + seed.to_bytes(8, "little", signed=True))
        value = digest.digest()
        draw = int.from_bytes(value[:8], "little") / 2**64
        if draw >= self.error_rate:
            return None
        return int.from_bytes(value[8:12], "little") % planned_tokens

    @property
    def stall_point(self) -> int | None:
        """Output tokens of a run after which it stalls; ``None`` for never."""
        return self.stall_after_tokens or None

    def generation_started(self) -> None:
        """Count an admitted generation; fire the crash on the configured one."""
        self.generations_started += 1
        if self.generations_started == self.crash_after_generations and self._on_crash is not None:
            log.error("injected crash after %d generations started", self.generations_started)
            self._on_crash()
