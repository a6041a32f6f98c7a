"""``llmmesh bench retrieval``: hybrid search in the mesh's vector stores
against a brute-force exact search, on a generated corpus with known answers.

The mesh runs as ``llmmesh up`` runs it (one process per plane; the
region's zone store an SQLite file, so the searches run on sqlite-vec and
FTS5). The corpus (:mod:`llmmesh.bench.retrieval_corpus`) is uploaded
through the edge as one file per document into one vector store, chunked so
that each document is one chunk. Two systems answer the same questions:

- ``mesh_hybrid``: ``POST /v1/vector_stores/{id}/search`` with
  ``max_num_results`` 5 (the edge embeds nothing itself: the region embeds
  the query with the mesh's embedding model, ranks by sqlite-vec k-NN and
  FTS5 BM25 and fuses the rankings);
- ``exact_bruteforce``: the query embedded through ``/v1/embeddings`` with
  the same model, then the cosine similarity to every document's vector
  (embedded once, the same way) computed in this process, top 5 by score.

Latency is the client's wall time per question (query embedding included
for both). ``recall_at_5`` is the share of questions whose known answer is
among the 5 results; ``overlap_at_5`` (in ``ratios``) the mean share of the
hybrid top 5 that the exact top 5 also holds. The target is a hybrid
recall@5 of at least 0.95.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from llmmesh.bench.overhead_plan import OverheadBenchPlan
from llmmesh.bench.overhead_systems import running_mesh
from llmmesh.bench.retrieval_corpus import Corpus, generate_corpus
from llmmesh.bench.routing_systems import API_KEY
from llmmesh.bench.stats import percentile

Progress = Callable[[str], None]
EMBEDDING_MODEL = "llmmesh-tiny-embed"
RECALL_TARGET = 0.95
TOP_K = 5
_EMBED_BATCH = 32
_UPLOADS_AT_ONCE = 8


@dataclass(frozen=True)
class RetrievalBenchPlan:
    """The corpus size, the questions asked and the seed."""

    documents: int = 400
    questions: int = 100
    seed: int = 7
    startup_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not 1 <= self.questions <= self.documents:
            raise ValueError("questions must be between 1 and the number of documents")


@dataclass
class SystemResult:
    """One system's latencies and hits."""

    latencies_s: list[float] = field(default_factory=list)
    hits: int = 0
    errors: int = 0
    top: list[list[int]] = field(default_factory=list)

    def metrics(self, asked: int) -> dict[str, float | int | None]:
        def p(q: float) -> float | None:
            return round(percentile(self.latencies_s, q), 6) if self.latencies_s else None

        return {
            "retrieval_p50_s": p(50),
            "retrieval_p99_s": p(99),
            "recall_at_5": round(self.hits / asked, 4) if asked else None,
            "errors": self.errors,
        }


@dataclass
class RetrievalReport:
    """The figures of one run."""

    plan: RetrievalBenchPlan
    engine: str
    results: dict[str, SystemResult]
    overlap_at_5: float

    def as_dict(self) -> dict[str, object]:
        asked = self.plan.questions
        results = {name: r.metrics(asked) for name, r in self.results.items()}
        hybrid, exact = results["mesh_hybrid"], results["exact_bruteforce"]
        p50_h, p50_e = hybrid["retrieval_p50_s"], exact["retrieval_p50_s"]
        recall = hybrid["recall_at_5"]
        return {
            "scenario": "retrieval",
            "results": results,
            "ratios": {
                "retrieval_p50_mesh_over_exact": round(p50_h / p50_e, 4) if p50_h and p50_e else None,
                "overlap_at_5": round(self.overlap_at_5, 4),
            },
            "corpus": {"documents": self.plan.documents, "questions": asked, "seed": self.plan.seed},
            "search_engine": self.engine,
            "targets": {
                "recall_at_5_min": RECALL_TARGET,
                "met": recall is not None and recall >= RECALL_TARGET,
            },
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), allow_nan=False, separators=(", ", ": "))

    def to_table(self) -> str:
        lines = [
            f"retrieval: {self.plan.documents} documents, {self.plan.questions} questions ({self.engine})"
        ]
        lines.append(f"{'system':<18}{'p50 s':>10}{'p99 s':>10}{'recall@5':>10}{'errors':>8}")
        for name, result in self.results.items():
            m = result.metrics(self.plan.questions)
            lines.append(
                f"{name:<18}{m['retrieval_p50_s']!s:>10}{m['retrieval_p99_s']!s:>10}"
                f"{m['recall_at_5']!s:>10}{m['errors']!s:>8}"
            )
        lines.append(f"overlap@5 of hybrid with exact: {self.overlap_at_5:.3f}")
        return "\n".join(lines)


def cosine_top(query: Sequence[float], vectors: Sequence[Sequence[float]], k: int) -> list[int]:
    """Indexes of the ``k`` vectors most similar to ``query`` (exact, every vector scored)."""
    qn = math.sqrt(sum(x * x for x in query)) or 1.0
    scores = []
    for index, vector in enumerate(vectors):
        vn = math.sqrt(sum(x * x for x in vector)) or 1.0
        scores.append((sum(a * b for a, b in zip(query, vector, strict=True)) / (qn * vn), -index))
    return [-neg for _, neg in sorted(scores, reverse=True)[:k]]


class RetrievalBench:
    """Runs the scenario against a fresh mesh."""

    def __init__(self, plan: RetrievalBenchPlan, run_dir: Path, progress: Progress) -> None:
        self._plan = plan
        self._run_dir = run_dir
        self._progress = progress

    async def run(self) -> RetrievalReport:
        plan = self._plan
        corpus = generate_corpus(plan.documents, plan.questions, plan.seed)
        mesh_plan = OverheadBenchPlan(levels=(1,), startup_timeout_s=plan.startup_timeout_s)
        async with running_mesh(mesh_plan, False, self._run_dir, self._progress) as mesh:
            headers = {"authorization": f"Bearer {API_KEY}"}
            async with httpx.AsyncClient(
                base_url=f"{mesh.edge_url}/v1", headers=headers, timeout=300
            ) as http:
                return await self._measure(http, corpus)

    async def _measure(self, http: httpx.AsyncClient, corpus: Corpus) -> RetrievalReport:
        self._progress(f"uploading {len(corpus.documents)} documents")
        store = await _post(http, "/vector_stores", json={"name": "bench-retrieval"})
        file_ids = await self._upload(http, corpus, str(store["id"]))
        by_file = {file_id: index for index, file_id in enumerate(file_ids)}
        self._progress("embedding the documents for the exact search")
        vectors = await _embed(http, [d.text for d in corpus.documents])
        hybrid, exact = SystemResult(), SystemResult()
        engine = ""
        self._progress(f"asking {len(corpus.questions)} questions of each system")
        for question in corpus.questions:
            started = time.perf_counter()
            try:
                response = await http.post(
                    f"/vector_stores/{store['id']}/search",
                    json={"query": question.text, "max_num_results": TOP_K},
                )
                response.raise_for_status()
                hybrid.latencies_s.append(time.perf_counter() - started)
                engine = response.headers.get("x-llmmesh-search-engine", engine)
                found = [by_file.get(hit["file_id"], -1) for hit in response.json()["data"]]
            except httpx.HTTPError:
                hybrid.errors += 1
                found = []
            hybrid.top.append(found)
            hybrid.hits += question.answer in found
            started = time.perf_counter()
            try:
                [query] = await _embed(http, [question.text])
                best = cosine_top(query, vectors, TOP_K)
                exact.latencies_s.append(time.perf_counter() - started)
            except httpx.HTTPError:
                exact.errors += 1
                best = []
            exact.top.append(best)
            exact.hits += question.answer in best
        overlaps = [len(set(h) & set(e)) / TOP_K for h, e in zip(hybrid.top, exact.top, strict=True)]
        overlap = sum(overlaps) / len(overlaps) if overlaps else 0.0
        results = {"mesh_hybrid": hybrid, "exact_bruteforce": exact}
        return RetrievalReport(self._plan, engine, results, overlap)

    async def _upload(self, http: httpx.AsyncClient, corpus: Corpus, store_id: str) -> list[str]:
        """Each document a file added to the store as one chunk; the file ids in corpus order."""
        gate = asyncio.Semaphore(_UPLOADS_AT_ONCE)
        whole = {"type": "static", "static": {"max_chunk_size_tokens": 1024, "chunk_overlap_tokens": 0}}

        async def one(name: str, text: str) -> str:
            async with gate:
                files = {"file": (name, text.encode())}
                created = await _post(http, "/files", files=files, data={"purpose": "assistants"})
                file_id = str(created["id"])
                await _post(
                    http,
                    f"/vector_stores/{store_id}/files",
                    json={"file_id": file_id, "chunking_strategy": whole},
                )
                return file_id

        return list(await asyncio.gather(*(one(d.name, d.text) for d in corpus.documents)))


async def _post(http: httpx.AsyncClient, path: str, **kwargs: object) -> dict[str, object]:
    response = await http.post(path, **kwargs)  # type: ignore[arg-type]
    if response.status_code != 200:
        raise RuntimeError(f"POST {path}: {response.status_code} {response.text}")
    body: dict[str, object] = response.json()
    return body


async def _embed(http: httpx.AsyncClient, texts: Sequence[str]) -> list[list[float]]:
    vectors: list[list[float]] = []
    for start in range(0, len(texts), _EMBED_BATCH):
        body = await _post(
            http,
            "/embeddings",
            json={"model": EMBEDDING_MODEL, "input": list(texts[start : start + _EMBED_BATCH])},
        )
        data = body["data"]
        assert isinstance(data, list)
        vectors.extend(list(item["embedding"]) for item in data)
    return vectors
