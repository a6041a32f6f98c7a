"""What ``llmmesh bench engine`` runs: levels, request counts, lengths.
Kept apart from the scenario so the command line can build one cheaply."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineBenchPlan:
    """What to run. Each system serves ``rounds`` rounds per level of
    ``requests_per_level`` requests each (None means 4 x concurrency)."""

    concurrency: tuple[int, ...] = (8, 32)
    requests_per_level: int | None = None
    rounds: int = 4
    max_tokens: int = 128
    warmup_requests: int = 32
    model_path: str = ""
    startup_timeout_s: float = 180.0
    request_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError("concurrency levels must be positive")
        if self.rounds < 1:
            raise ValueError("rounds must be positive")
        if self.requests_per_level is not None and self.requests_per_level < 1:
            raise ValueError("requests per level must be positive")
        if self.max_tokens < 1 or self.warmup_requests < 0:
            raise ValueError("max_tokens must be positive and warm-up requests not negative")

    def requests_at(self, concurrency: int) -> int:
        return self.requests_per_level or 4 * concurrency
