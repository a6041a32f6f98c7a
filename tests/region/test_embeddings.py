"""The region's embeddings and moderation services over a real in-process
stack (global plane, a simulator pod, a region): placement on the pod that
embeds, metering and billing, refusals naming their param, and moderation by
the region's safety backends with OpenAI's category names."""

from __future__ import annotations

import asyncio
import math
from decimal import Decimal

import grpc
import grpc.aio
import pytest

from llmmesh.core.embedding_tokens import TOKEN_IDS_HEADER
from llmmesh.core.errors import Reason, Unavailable, from_rpc_error
from llmmesh.region.embedding_pods import EmbeddingPods
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.safety import OPENAI_CATEGORIES
from llmmesh.v1 import chat_service_pb2, chat_service_pb2_grpc, common_pb2
from llmmesh.v1 import embedding_service_pb2 as epb
from llmmesh.v1 import embedding_service_pb2_grpc as epb_grpc
from llmmesh.v1 import moderation_service_pb2 as mpb
from llmmesh.v1 import moderation_service_pb2_grpc as mpb_grpc
from tests.region.support import every_slot_held
from tests.region.test_chat_servicer import auth
from tests.stack import DEV_KEY, Stack, running_stack

pytestmark = pytest.mark.asyncio
MODEL = "llmmesh-tiny-embed"
AUTH = auth()


async def _create(
    stack: Stack,
    request: epb.CreateEmbeddingsRequest,
    key: str = DEV_KEY,
    extra: tuple[tuple[str, str], ...] = (),
) -> epb.CreateEmbeddingsResponse:
    async with grpc.aio.insecure_channel(stack.region.address) as channel:
        stub = epb_grpc.RegionEmbeddingServiceStub(channel)
        response: epb.CreateEmbeddingsResponse = await stub.CreateEmbeddings(
            request, metadata=auth(key) + extra, timeout=10
        )
        return response


async def _refusal(
    stack: Stack, request: epb.CreateEmbeddingsRequest, key: str = DEV_KEY
) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _create(stack, request, key)
    err = from_rpc_error(caught.value)
    return err.code, err.reason, err.metadata.get("param", "")


def _texts(*texts: str) -> list[epb.EmbeddingInput]:
    return [epb.EmbeddingInput(text=t) for t in texts]


async def test_the_region_reports_the_embedding_model_its_pods_serve(stack: Stack) -> None:
    assert MODEL in stack.region.info().models


async def test_embeddings_are_metered_recorded_and_billed(stack: Stack) -> None:
    request = epb.CreateEmbeddingsRequest(
        request_id="emb-test-1", model=MODEL, inputs=_texts("hello mesh", "another text here"), user="user-e1"
    )
    answer = await _create(stack, request)
    assert answer.model == MODEL and answer.region == "us-east" and answer.zone == "us"
    assert [len(e.values) for e in answer.embeddings] == [256, 256]
    for embedding in answer.embeddings:
        assert math.isclose(sum(x * x for x in embedding.values), 1.0, rel_tol=1e-5)
    used = sum(e.input_tokens for e in answer.embeddings)
    assert used > 0 and answer.usage.input_tokens == used and answer.usage.output_tokens == 0
    assert answer.rate_limit.limit_requests >= 0
    tenant = stack.region.policy.authenticate(DEV_KEY).tenant_id
    pending = [row.request_id for row in await stack.region.store.pending_usage()]
    assert "emb-test-1" in pending
    assert await stack.region.shipper.flush(timeout_s=10)
    billed = await stack.global_plane.ledger.usage(tenant, "")
    assert billed.input_tokens == used and billed.output_tokens == 0
    assert str(billed.cost_usd.normalize()) == str(Decimal(answer.cost_usd).normalize())
    pseudonym = await stack.region.shipper.pseudonyms.of(tenant, "user-e1")
    assert (await stack.global_plane.ledger.usage(tenant, "", end_user=pseudonym)).input_tokens == used


async def test_a_reused_request_id_gets_no_second_answer(stack: Stack) -> None:
    request = epb.CreateEmbeddingsRequest(request_id="emb-twice", model=MODEL, inputs=_texts("once"))
    await _create(stack, request)
    code, reason, _ = await _refusal(stack, request)
    assert (code, reason) == (grpc.StatusCode.ALREADY_EXISTS, Reason.DUPLICATE_REQUEST)


async def test_dimensions_and_declared_token_inputs_reach_the_pod(stack: Stack) -> None:
    tokens = epb.EmbeddingInput(tokens=epb.EmbeddingTokens(ids=[10, 11, 12]))
    request = epb.CreateEmbeddingsRequest(model=MODEL, inputs=[tokens], dimensions=32)
    answer = await _create(stack, request, extra=((TOKEN_IDS_HEADER, MODEL),))
    assert len(answer.embeddings[0].values) == 32
    assert answer.embeddings[0].input_tokens == 3
    # Undeclared ids may be another tokenizer's (tiktoken's): refused, naming input.
    code, _, param = await _refusal(stack, request)
    assert (code, param) == (grpc.StatusCode.INVALID_ARGUMENT, "input")


@pytest.mark.parametrize(
    ("request_", "code", "param"),
    [
        (epb.CreateEmbeddingsRequest(model=MODEL), grpc.StatusCode.INVALID_ARGUMENT, "input"),
        (
            epb.CreateEmbeddingsRequest(model=MODEL, inputs=_texts("")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "input",
        ),
        (
            epb.CreateEmbeddingsRequest(model=MODEL, inputs=[epb.EmbeddingInput()]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "input",
        ),
        (epb.CreateEmbeddingsRequest(inputs=_texts("x")), grpc.StatusCode.INVALID_ARGUMENT, "model"),
        (
            epb.CreateEmbeddingsRequest(model="llmmesh-tiny", inputs=_texts("x")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "model",
        ),
        (epb.CreateEmbeddingsRequest(model="nope", inputs=_texts("x")), grpc.StatusCode.NOT_FOUND, "model"),
        (
            epb.CreateEmbeddingsRequest(model=MODEL, inputs=_texts("x"), dimensions=0),
            grpc.StatusCode.INVALID_ARGUMENT,
            "dimensions",
        ),
        (
            epb.CreateEmbeddingsRequest(model=MODEL, inputs=_texts("x"), dimensions=4096),
            grpc.StatusCode.INVALID_ARGUMENT,
            "dimensions",
        ),
        (
            epb.CreateEmbeddingsRequest(model=MODEL, inputs=_texts("x"), user="a\nforged log line"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "user",
        ),
    ],
)
async def test_bad_requests_are_refused_naming_the_param(
    stack: Stack, request_: epb.CreateEmbeddingsRequest, code: grpc.StatusCode, param: str
) -> None:
    got_code, _, got_param = await _refusal(stack, request_)
    assert (got_code, got_param) == (code, param)


async def test_a_refused_request_is_not_billed(stack: Stack) -> None:
    await _refusal(stack, epb.CreateEmbeddingsRequest(model=MODEL, inputs=_texts("x"), dimensions=4096))
    assert await stack.region.store.pending_usage() == []


async def test_an_unknown_key_is_refused(stack: Stack) -> None:
    code, _, _ = await _refusal(
        stack, epb.CreateEmbeddingsRequest(model=MODEL, inputs=_texts("x")), "sk-nope"
    )
    assert code == grpc.StatusCode.UNAUTHENTICATED


async def _moderate(stack: Stack, request: mpb.ModerateRequest) -> mpb.ModerateResponse:
    async with grpc.aio.insecure_channel(stack.region.address) as channel:
        response: mpb.ModerateResponse = await mpb_grpc.ModerationServiceStub(channel).Moderate(
            request, metadata=AUTH, timeout=10
        )
        return response


async def test_moderation_answers_with_openai_categories(stack: Stack) -> None:
    answer = await _moderate(
        stack, mpb.ModerateRequest(inputs=["What a lovely day.", "I want to kill myself tonight."])
    )
    assert answer.model == "llmmesh-moderation" and list(answer.backends) == ["rules"]
    clean, flagged = answer.results
    assert [c.name for c in clean.categories] == list(OPENAI_CATEGORIES)
    assert not clean.flagged and all(c.score == 0.0 for c in clean.categories)
    assert flagged.flagged
    found = {c.name: c.score for c in flagged.categories if c.flagged}
    assert found == {"self-harm/intent": 1.0}


async def test_moderation_refuses_other_models_and_empty_batches(stack: Stack) -> None:
    for request, code, param in (
        (
            mpb.ModerateRequest(model="omni-moderation-2024-09-26", inputs=["x"]),
            grpc.StatusCode.NOT_FOUND,
            "model",
        ),
        (mpb.ModerateRequest(), grpc.StatusCode.INVALID_ARGUMENT, "input"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _moderate(stack, request)
        err = from_rpc_error(caught.value)
        assert (err.code, err.metadata.get("param")) == (code, param)


async def test_a_region_without_safety_backends_refuses_to_moderate() -> None:
    async with running_stack(region_overrides={"safety_backends": "none"}) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _moderate(stack, mpb.ModerateRequest(inputs=["hello"]))
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_a_chat_turn_on_the_embedding_model_is_refused_for_good(stack: Stack) -> None:
    start = chat_service_pb2.ChatRequest(
        start=chat_service_pb2.ChatStart(
            model=MODEL, messages=[common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content="hi")]
        )
    )
    async with grpc.aio.insecure_channel(stack.region.address) as channel:
        call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(iter([start]), metadata=AUTH, timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call.read()
    err = from_rpc_error(caught.value)
    assert (err.code, err.metadata.get("param")) == (grpc.StatusCode.INVALID_ARGUMENT, "model")
    assert "embedding model" in err.message


async def test_embeddings_and_moderation_do_not_wait_for_chat_slots(stack: Stack) -> None:
    # Every chat slot taken (as with every chat pod busy or gone): embeddings
    # and moderation, which no chat pod serves, are answered all the same.
    queue = stack.region.gateway.admission.queue
    async with every_slot_held(queue):
        # An upper bound so a regression fails the test instead of hanging it (not a timing assert).
        async with asyncio.timeout(30):
            embedded = await _create(stack, epb.CreateEmbeddingsRequest(model=MODEL, inputs=_texts("hi")))
            moderated = await _moderate(stack, mpb.ModerateRequest(inputs=["What a lovely day."]))
        assert len(embedded.embeddings) == 1 and embedded.usage.input_tokens > 0
        assert len(moderated.results) == 1
        assert queue.stats().total_waiting == 0


async def test_a_pod_whose_first_answer_was_late_is_asked_before_a_refusal(stack: Stack) -> None:
    # As if the pod's answer to the start-up probe had timed out: the region
    # knows no embedding model until a request asks the pods again.
    pods = stack.region.embedding_pods
    pods._known.clear()
    assert pods.models == []
    request = epb.CreateEmbeddingsRequest(request_id="emb-late-info", model=MODEL, inputs=_texts("late"))
    answer = await _create(stack, request)
    assert answer.model == MODEL and pods.models == [MODEL]
    # A chat model no pod embeds with is still refused by name after asking.
    pods._known.clear()
    chat_model = epb.CreateEmbeddingsRequest(model="llmmesh-tiny", inputs=_texts("x"))
    code, _, param = await _refusal(stack, chat_model)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and param == "model" and pods.models == [MODEL]


async def test_a_model_is_not_refused_by_name_while_a_pod_has_not_answered() -> None:
    # A pod down since the region started has never said what it embeds: it
    # may serve the model asked for, so the refusal is a retry, naming the pod.
    pool = EnginePool(["127.0.0.1:9"])
    try:
        pods = EmbeddingPods(pool)
        assert [p.address for p in pods.unanswered] == ["127.0.0.1:9"]
        with pytest.raises(Unavailable) as caught:
            await pods.place(MODEL)
        assert caught.value.retry_after_s == 1.0 and "127.0.0.1:9" in str(caught.value)
    finally:
        await pool.close()
