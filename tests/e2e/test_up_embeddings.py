"""Embeddings and moderations on the running mesh (``llmmesh up``, simulator
pods, which embed by default), through the official ``openai`` SDK: an
``eu`` tenant's embeddings are run, and recorded, only in ``eu``."""

from __future__ import annotations

import math
import time

import openai
import pytest

from tests.e2e.conftest import RunningMesh, served_requests

pytestmark = pytest.mark.e2e
MODEL = "llmmesh-tiny-embed"


def test_embeddings_and_moderations_through_the_sdk(mesh: RunningMesh) -> None:
    with openai.OpenAI(
        base_url=mesh.edge_url + "/v1", api_key=mesh.api_key, max_retries=0, timeout=30
    ) as sdk:
        assert MODEL in [m.id for m in sdk.models.list().data]
        result = sdk.embeddings.create(model=MODEL, input=["hello mesh", "another one"], dimensions=64)
        assert [len(d.embedding) for d in result.data] == [64, 64]
        assert all(
            math.isclose(math.sqrt(sum(x * x for x in d.embedding)), 1.0, rel_tol=1e-5) for d in result.data
        )
        assert result.usage.prompt_tokens > 0
        verdict = sdk.moderations.create(input="i know where you live")
        assert verdict.results[0].flagged and verdict.results[0].categories.harassment_threatening


def test_an_eu_tenants_embeddings_stay_in_eu(mesh: RunningMesh) -> None:
    with openai.OpenAI(
        base_url=mesh.edge_url + "/v1", api_key=mesh.key("eu"), max_retries=0, timeout=30
    ) as sdk:
        raw = sdk.embeddings.with_raw_response.create(model=MODEL, input="residency check")
    request_id = raw.headers["x-request-id"]
    assert raw.headers["x-llmmesh-region"].startswith("eu-")
    deadline = time.monotonic() + 30
    eu: set[str] = set()
    while request_id not in eu and time.monotonic() < deadline:
        eu = set().union(*served_requests(mesh.store_url("eu")).values())
        time.sleep(0.1)
    assert request_id in eu
    us = set().union(*served_requests(mesh.store_url("us")).values())
    assert request_id not in us
