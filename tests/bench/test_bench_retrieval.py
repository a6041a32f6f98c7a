"""``llmmesh bench retrieval``'s parts that need no mesh: the generated
corpus, the exact search and the report's JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmmesh.bench.retrieval import RetrievalBenchPlan, RetrievalReport, SystemResult, cosine_top
from llmmesh.bench.retrieval_corpus import generate_corpus


def test_the_corpus_is_seeded_and_each_question_has_its_document() -> None:
    corpus = generate_corpus(50, 10, seed=3)
    assert corpus == generate_corpus(50, 10, seed=3)
    assert len({d.name for d in corpus.documents}) == 50
    for question in corpus.questions:
        place = question.text.split(" of the ")[1].split()[0]
        assert place in corpus.documents[question.answer].text
    with pytest.raises(ValueError, match="questions"):
        generate_corpus(3, 4)


def test_exact_search_scores_every_vector() -> None:
    vectors = [[1.0, 0.0], [0.0, 1.0], [0.7, 0.7], [-1.0, 0.0]]
    assert cosine_top([1.0, 0.1], vectors, 2) == [0, 2]


def test_the_report_is_one_json_line_with_recall_and_the_target() -> None:
    plan = RetrievalBenchPlan(documents=4, questions=2)
    hybrid = SystemResult(latencies_s=[0.02, 0.04], hits=2)
    exact = SystemResult(latencies_s=[0.01, 0.01], hits=1, errors=1)
    report = RetrievalReport(plan, "sqlite-vec+fts5", {"mesh_hybrid": hybrid, "exact_bruteforce": exact}, 0.6)
    line = report.to_json()
    assert "\n" not in line
    data = json.loads(line)
    assert data["scenario"] == "retrieval"
    assert data["results"]["mesh_hybrid"]["recall_at_5"] == 1.0
    assert data["results"]["exact_bruteforce"]["recall_at_5"] == 0.5
    assert data["results"]["exact_bruteforce"]["errors"] == 1
    assert data["ratios"]["retrieval_p50_mesh_over_exact"] == pytest.approx(3.0)
    assert data["targets"] == {"recall_at_5_min": 0.95, "met": True}
    assert "recall@5" in report.to_table()


@pytest.mark.e2e
def test_a_small_run_through_the_real_mesh_meets_the_recall_target(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "llmmesh",
        "bench",
        "retrieval",
        "--json",
        "--documents",
        "30",
        "--requests",
        "8",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout.strip().splitlines()[-1])
    assert data["search_engine"] == "sqlite-vec+fts5"
    for system in ("mesh_hybrid", "exact_bruteforce"):
        assert data["results"][system]["errors"] == 0
        assert data["results"][system]["retrieval_p99_s"] >= data["results"][system]["retrieval_p50_s"] > 0
    assert data["targets"]["met"] and data["results"]["mesh_hybrid"]["recall_at_5"] >= 0.95
