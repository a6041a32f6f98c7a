"""schemathesis against the live edge's own OpenAPI document: generated
requests, valid and invalid, to every operation find no server error, and
the answers conform to the document (status codes, content types, bodies,
headers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import hypothesis
import hypothesis.errors
import pytest
import pytest_asyncio
import schemathesis
from hypothesis import HealthCheck, Phase
from hypothesis import strategies as st
from schemathesis.checks import CheckFunction, not_a_server_error
from schemathesis.core.result import Err
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.stack import DEV_KEY, Stack, running_stack

# Bounded: every operation gets at most this many requests per generation mode.
EXAMPLES_PER_OPERATION = 12
REQUEST_TIMEOUT_S = 30.0
AUTH = {"Authorization": f"Bearer {DEV_KEY}"}
Operation = schemathesis.APIOperation[Any, Any, Any, Any]
Case = schemathesis.Case[Any]
CHECKS: dict[schemathesis.GenerationMode, list[CheckFunction]] = {
    schemathesis.GenerationMode.POSITIVE: [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
        response_headers_conformance,
    ],
    # Invalid requests must be refused cleanly, with a documented answer.
    schemathesis.GenerationMode.NEGATIVE: [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
    ],
}


@pytest_asyncio.fixture
async def stack() -> AsyncIterator[Stack]:
    # A fast simulator: a generated max_tokens must not make the run long.
    async with running_stack(
        with_edge=True,
        context_window=512,
        sim_prefill_overhead_s=0.0001,
        sim_prefill_per_token_s=0.000001,
        sim_inter_token_s=0.0001,
    ) as running:
        yield running


def fuzz(document: dict[str, object], base_url: str) -> list[str]:
    """Send every operation its requests; one line per failing operation and mode."""
    schema = schemathesis.openapi.from_dict(document)
    failures: list[str] = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            failures.append(f"an operation of the document is invalid: {result.err()}")
            continue
        operation = result.ok()
        for mode, checks in CHECKS.items():
            try:
                examples(requests(schema, operation, mode, base_url), checks, base_url)()
            except hypothesis.errors.Unsatisfiable:
                # An operation without parameters or body has no invalid request to send.
                assert mode == schemathesis.GenerationMode.NEGATIVE, operation.label
            # Every failing operation is reported, not only the first; schemathesis
            # raises a group of the distinct failures it found.
            except (Exception, BaseExceptionGroup) as exc:
                failures.append(f"{operation.label} [{mode}]: {describe(exc)}")
    return failures


def describe(exc: BaseException) -> str:
    """The failure with what it groups (a flaky run's first failure says what it was)."""
    if isinstance(exc, BaseExceptionGroup):
        inner = "; ".join(describe(e) for e in exc.exceptions)
        return f"{exc}: {inner}"
    return f"{type(exc).__name__}: {exc}"


def requests(
    schema: schemathesis.BaseSchema,
    operation: Operation,
    mode: schemathesis.GenerationMode,
    base_url: str,
) -> st.SearchStrategy[Case]:
    """Generated requests; valid ones also from the document's examples.

    Valid requests about a conversation or a stream name a live one (a new
    one for each operation), so that they reach the region's store and the
    stream log rather than stopping at a 404.
    """
    if mode != schemathesis.GenerationMode.POSITIVE:
        return operation.as_strategy(generation_mode=mode)
    cases = st.one_of(
        operation.as_strategy(generation_mode=mode), *schema.get_strategies_from_examples(operation)
    )
    live = {name: make(base_url) for name, make in LIVE.items() if f"{{{name}}}" in operation.path}
    if not live:
        return cases

    def about_live_objects(case: Case) -> Case:
        case.path_parameters = {**(case.path_parameters or {}), **live}
        return case

    return cases.map(about_live_objects)


def new_conversation(base_url: str) -> str:
    created = httpx.post(f"{base_url}/v1/conversations", json={}, headers=AUTH, timeout=REQUEST_TIMEOUT_S)
    return str(created.json()["id"])


def new_stream(base_url: str) -> str:
    body = {"model": "auto", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
    started = httpx.post(
        f"{base_url}/v1/chat/completions", json=body, headers=AUTH, timeout=REQUEST_TIMEOUT_S
    )
    return started.headers["x-request-id"]


LIVE: dict[str, Callable[[str], str]] = {"conversation_id": new_conversation, "stream_id": new_stream}
"""How to make a live object for each path parameter that names one."""


def examples(
    cases: st.SearchStrategy[Case], checks: list[CheckFunction], base_url: str
) -> Callable[[], None]:
    """A Hypothesis test sending ``cases`` and checking the answers."""

    @hypothesis.given(case=cases)
    @hypothesis.settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Case) -> None:
        case.call_and_validate(base_url=base_url, headers=AUTH, checks=checks, timeout=REQUEST_TIMEOUT_S)

    return run


@pytest.mark.slow
@pytest.mark.asyncio
async def test_generated_requests_find_no_server_errors(stack: Stack) -> None:
    assert stack.edge is not None
    async with httpx.AsyncClient(base_url=stack.edge.url, timeout=30) as http:
        resp = await http.get("/openapi.json")
    assert resp.status_code == 200
    document = resp.json()
    assert document["openapi"].startswith("3.1")
    # The blocking HTTP client runs in a thread; this loop serves the mesh meanwhile.
    failures = await asyncio.to_thread(fuzz, document, stack.edge.url)
    assert not failures, "\n\n".join(failures)
