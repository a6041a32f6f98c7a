"""Per-request timing, as the client sees it, and the metrics of one level.

Times are ``time.perf_counter()`` seconds taken in the benchmark process, so
every system is timed by the same clock at the same place: the client.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0 ≤ q ≤ 100) of ``values`` by linear
    interpolation between closest ranks, numpy's default method (which vLLM's
    own benchmark uses). Raises ValueError for no values or ``q`` outside
    [0, 100]."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be between 0 and 100, got {q}")
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    fraction = rank - low
    below, above = ordered[low], ordered[high]
    # Rounding must not carry the result past its neighbours.
    return min(max(below + (above - below) * fraction, below), above)


@dataclass
class RequestRecord:
    """What the client saw of one request: when it was sent, when each chunk
    of tokens arrived and how many it carried, and how it ended."""

    sent_at: float
    chunks: list[tuple[float, int]] = field(default_factory=list)
    finished_at: float | None = None
    error: str | None = None
    served_by: str = ""
    """The engine pod that served it, when the system says (ours does)."""

    def add_tokens(self, at: float, count: int) -> None:
        """Record a chunk of ``count`` tokens arriving at ``at``; empty chunks
        (text held back, role-only frames) carry no token and are ignored."""
        if count > 0:
            self.chunks.append((at, count))

    def finish(self, at: float) -> None:
        """The stream ended normally at ``at``."""
        self.finished_at = at

    def fail(self, reason: str) -> None:
        """The request failed; the first reason given is kept."""
        if self.error is None:
            self.error = reason

    @property
    def ok(self) -> bool:
        """Finished normally, with no error."""
        return self.error is None and self.finished_at is not None

    @property
    def output_tokens(self) -> int:
        """Tokens received, whatever the outcome."""
        return sum(count for _, count in self.chunks)

    @property
    def ttft_s(self) -> float | None:
        """Request sent to first token received; None when no token came."""
        return self.chunks[0][0] - self.sent_at if self.chunks else None

    def itl_samples(self) -> list[float]:
        """Gaps between successive tokens, one sample per token after the
        first chunk: a chunk of k tokens arriving ``gap`` after the previous
        chunk contributes ``gap / k`` k times. The first chunk's tokens have
        no predecessor at the client (that wait is TTFT) and contribute none."""
        samples: list[float] = []
        for (previous, _), (at, count) in zip(self.chunks, self.chunks[1:], strict=False):
            samples.extend([(at - previous) / count] * count)
        return samples


@dataclass(frozen=True)
class LevelMetrics:
    """The figures of one system at one concurrency level (MISSION's names).
    Latency percentiles are None when no request produced a token."""

    requests: int
    errors: int
    output_tokens: int
    wall_s: float
    output_tok_s: float
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        """JSON-ready, seconds rounded to microseconds."""
        return {
            "requests": self.requests,
            "errors": self.errors,
            "output_tokens": self.output_tokens,
            "wall_s": _round(self.wall_s),
            "output_tok_s": _round(self.output_tok_s, 3),
            "ttft_p50_s": _round(self.ttft_p50_s),
            "ttft_p90_s": _round(self.ttft_p90_s),
            "ttft_p99_s": _round(self.ttft_p99_s),
            "itl_p50_s": _round(self.itl_p50_s),
        }


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def _optional_percentile(values: Sequence[float], q: float) -> float | None:
    return percentile(values, q) if values else None


def summarize(records: Sequence[RequestRecord], wall_s: float) -> LevelMetrics:
    """Metrics of one level from its records and its wall time (first request
    sent to last response ended). Every request counts in ``requests``;
    failed ones count in ``errors`` and give no latency samples, but the
    tokens they did deliver count in ``output_tokens`` and ``output_tok_s``."""
    good = [record for record in records if record.ok]
    ttfts = [ttft for record in good if (ttft := record.ttft_s) is not None]
    itls = [sample for record in good for sample in record.itl_samples()]
    output_tokens = sum(record.output_tokens for record in records)
    return LevelMetrics(
        requests=len(records),
        errors=len(records) - len(good),
        output_tokens=output_tokens,
        wall_s=wall_s,
        output_tok_s=output_tokens / wall_s if wall_s > 0 else 0.0,
        ttft_p50_s=_optional_percentile(ttfts, 50),
        ttft_p90_s=_optional_percentile(ttfts, 90),
        ttft_p99_s=_optional_percentile(ttfts, 99),
        itl_p50_s=_optional_percentile(itls, 50),
    )
