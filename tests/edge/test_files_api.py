"""Files, vector stores and hybrid search through the edge, driven by the
official ``openai`` SDK over an in-process mesh: OpenAI's shapes, embedding
by the mesh's own model (billed), refusals naming their param, and tenants
that cannot see each other's files."""

from __future__ import annotations

import grpc
import grpc.aio
import openai
import pytest

from llmmesh.core.errors import from_rpc_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.v1 import retrieval_service_pb2 as rpb
from llmmesh.v1 import retrieval_service_pb2_grpc
from tests.edge.sdk import async_client
from tests.edge.test_conversations_api import new_tenant
from tests.stack import Stack

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    """One mesh for the module's tests: none leaves anything another reads."""
    return shared_stack


DOCS = {
    "france.txt": "The capital of France is Paris. The Louvre in Paris is the largest art museum.",
    "japan.txt": "Tokyo is the capital of Japan. Mount Fuji is the highest mountain in Japan.",
    "rust.txt": "Rust is a programming language. Its borrow checker enforces ownership rules.",
}


async def _upload(client: openai.AsyncOpenAI) -> dict[str, str]:
    ids = {}
    for name, text in DOCS.items():
        created = await client.files.create(file=(name, text.encode()), purpose="assistants")
        assert (created.object, created.filename, created.bytes) == ("file", name, len(text.encode()))
        assert created.status == "processed" and created.id.startswith("file-us-")
        ids[name] = created.id
    return ids


async def test_files_upload_list_retrieve_content_delete(stack: Stack) -> None:
    async with async_client(stack) as client:
        ids = await _upload(client)
        listed = [f.id async for f in client.files.list(limit=2)]
        assert sorted(listed) == sorted(ids.values())
        one = await client.files.retrieve(ids["japan.txt"])
        assert one.filename == "japan.txt"
        content = await client.files.content(ids["japan.txt"])
        assert content.read() == DOCS["japan.txt"].encode()
        assert content.response.headers["x-content-type-options"] == "nosniff"
        assert content.response.headers["content-disposition"] == "attachment"
        deleted = await client.files.delete(ids["rust.txt"])
        assert deleted.deleted and deleted.id == ids["rust.txt"]
        with pytest.raises(openai.NotFoundError) as caught:
            await client.files.retrieve(ids["rust.txt"])
        assert caught.value.code == "file_not_found"


async def test_vector_store_search_finds_the_answer_in_the_tenants_files(stack: Stack) -> None:
    async with async_client(stack) as client:
        ids = await _upload(client)
        store = await client.vector_stores.create(
            name="facts",
            file_ids=[ids["france.txt"], ids["japan.txt"]],
            metadata={"team": "geo"},
            chunking_strategy={
                "type": "static",
                "static": {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 20},
            },
        )
        assert (
            store.status == "completed"
            and store.file_counts.completed == 2
            and store.metadata == {"team": "geo"}
        )
        added = await client.vector_stores.files.create(vector_store_id=store.id, file_id=ids["rust.txt"])
        assert added.status == "completed" and added.usage_bytes == len(DOCS["rust.txt"])
        polled = await client.vector_stores.files.create_and_poll(
            vector_store_id=store.id, file_id=ids["rust.txt"], poll_interval_ms=10
        )
        assert polled.status == "completed" and polled.id == ids["rust.txt"]
        page = await client.vector_stores.search(
            store.id, query="What is the capital of Japan?", max_num_results=3
        )
        assert page.data[0].filename == "japan.txt" and page.data[0].file_id == ids["japan.txt"]
        assert "Tokyo" in page.data[0].content[0].text and 0 < page.data[0].score <= 1
        members = [m.id async for m in client.vector_stores.files.list(vector_store_id=store.id)]
        assert sorted(members) == sorted(ids.values())
        removed = await client.vector_stores.files.delete(file_id=ids["japan.txt"], vector_store_id=store.id)
        assert removed.deleted
        again = await client.vector_stores.search(store.id, query="capital of Japan Tokyo")
        assert all(hit.file_id != ids["japan.txt"] for hit in again.data)
        assert (await client.vector_stores.retrieve(store.id)).file_counts.total == 2
        assert [s.id async for s in client.vector_stores.list()] == [store.id]
        assert (await client.vector_stores.delete(store.id)).deleted


async def _attempt(client: openai.AsyncOpenAI, call: str) -> None:
    """One request the mesh does not serve."""
    if call == "purpose":
        await client.files.create(file=("a.txt", b"text"), purpose="batch")
    elif call == "binary":
        await client.files.create(file=("a.pdf", b"%PDF-\xff\xfe\x00"), purpose="assistants")
    elif call == "filters":
        store = await client.vector_stores.create(name="x")
        await client.vector_stores.search(
            store.id, query="q", filters={"type": "eq", "key": "a", "value": "b"}
        )
    elif call == "expires":
        await client.vector_stores.create(name="x", expires_after={"anchor": "last_active_at", "days": 1})
    else:
        await client.vector_stores.create(
            name="x",
            chunking_strategy={
                "type": "static",
                "static": {"max_chunk_size_tokens": 50, "chunk_overlap_tokens": 0},
            },
        )


@pytest.mark.parametrize(
    ("call", "param"),
    [
        ("purpose", "purpose"),
        ("binary", "file"),
        ("filters", "filters"),
        ("expires", "expires_after"),
        ("chunking", "chunking_strategy"),
    ],
)
async def test_what_is_not_served_is_refused_naming_it(stack: Stack, call: str, param: str) -> None:
    async with async_client(stack) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await _attempt(client, call)
        assert caught.value.param == param


async def test_another_tenant_cannot_see_or_search_them(stack: Stack) -> None:
    async with async_client(stack) as owner:
        ids = await _upload(owner)
        store = await owner.vector_stores.create(name="mine", file_ids=[ids["japan.txt"]])
        other_key = await new_tenant(stack, "other-files")
        async with async_client(stack, other_key) as other:
            assert [f async for f in other.files.list()] == []
            with pytest.raises(openai.NotFoundError):
                await other.files.content(ids["japan.txt"])
            with pytest.raises(openai.NotFoundError) as caught:
                await other.vector_stores.search(store.id, query="Tokyo")
            assert caught.value.code == "vector_store_not_found"
            with pytest.raises(openai.NotFoundError):
                await other.vector_stores.files.create(vector_store_id=store.id, file_id=ids["japan.txt"])


async def test_a_file_the_embedding_model_refuses_is_kept_as_failed(stack: Stack) -> None:
    async with async_client(stack) as client:
        long = await client.files.create(file=("long.txt", ("word " * 5000).encode()), purpose="assistants")
        store = await client.vector_stores.create(name="big")
        added = await client.vector_stores.files.create(
            vector_store_id=store.id,
            file_id=long.id,
            chunking_strategy={
                "type": "static",
                "static": {"max_chunk_size_tokens": 4096, "chunk_overlap_tokens": 0},
            },
        )
        assert added.status == "failed" and added.last_error is not None
        assert "tokens" in added.last_error.message and added.usage_bytes == 0
        counts = (await client.vector_stores.retrieve(store.id)).file_counts
        assert (counts.failed, counts.completed, counts.total) == (1, 0, 1)


# ------------------------------------------------------------------ file batches


async def test_file_batches_add_files_together_and_are_kept_in_the_zone(stack: Stack) -> None:
    async with async_client(stack, await new_tenant(stack, "batches")) as client:
        ids = await _upload(client)
        store = await client.vector_stores.create(name="batched")
        batches = client.vector_stores.file_batches
        batch = await batches.create_and_poll(
            vector_store_id=store.id, file_ids=[ids["france.txt"], ids["japan.txt"]], poll_interval_ms=10
        )
        assert batch.object == "vector_store.files_batch" and batch.id.startswith("vsfb_us_")
        assert (batch.status, batch.vector_store_id) == ("completed", store.id)
        counts = batch.file_counts
        assert (counts.completed, counts.failed, counts.in_progress, counts.cancelled, counts.total) == (
            2, 0, 0, 0, 2,
        )  # fmt: skip
        assert (await batches.retrieve(batch.id, vector_store_id=store.id)) == batch
        listed = [f async for f in batches.list_files(batch.id, vector_store_id=store.id, limit=1)]
        assert sorted(f.id for f in listed) == sorted([ids["france.txt"], ids["japan.txt"]])
        assert all(f.status == "completed" for f in listed)
        assert [
            f async for f in batches.list_files(batch.id, vector_store_id=store.id, filter="failed")
        ] == []
        page = await client.vector_stores.search(store.id, query="What is the capital of Japan?")
        assert page.data[0].file_id == ids["japan.txt"]
        with pytest.raises(openai.BadRequestError) as caught:
            await batches.cancel(batch.id, vector_store_id=store.id)
        assert caught.value.param == "batch_id" and "completed" in caught.value.message

        per_file = await batches.create(
            vector_store_id=store.id,
            files=[
                {
                    "file_id": ids["rust.txt"],
                    "chunking_strategy": {
                        "type": "static",
                        "static": {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 10},
                    },
                }
            ],
        )
        [rust] = [f async for f in batches.list_files(per_file.id, vector_store_id=store.id)]
        assert rust.chunking_strategy is not None and rust.chunking_strategy.type == "static"
        assert rust.chunking_strategy.static.max_chunk_size_tokens == 100

        uploaded = await batches.upload_and_poll(
            store.id, files=[("notes.txt", b"Lisbon is the capital of Portugal.")], poll_interval_ms=10
        )
        assert uploaded.status == "completed" and uploaded.file_counts.total == 1

        await client.vector_stores.files.delete(file_id=ids["japan.txt"], vector_store_id=store.id)
        after = await batches.retrieve(batch.id, vector_store_id=store.id)
        assert (after.file_counts.completed, after.file_counts.total) == (1, 1)
        assert (await client.vector_stores.retrieve(store.id)).file_counts.total == 3


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"file_ids": ["file-x"], "attributes": {"a": "b"}}, "attributes"),
        ({"files": [{"file_id": "file-x", "attributes": {"a": "b"}}]}, "files[0].attributes"),
        ({"files": [{"file_id": "file-x", "priority": 1}]}, "files[0].priority"),
        ({"file_ids": ["file-x"], "files": [{"file_id": "file-x"}]}, "file_ids"),
        ({}, "file_ids"),
        ({"files": [{"file_id": "file-x"}], "chunking_strategy": {"type": "auto"}}, "chunking_strategy"),
        ({"file_ids": []}, "file_ids"),
    ],
)
async def test_a_file_batch_refuses_what_it_does_not_serve_naming_it(
    stack: Stack, body: dict[str, object], param: str
) -> None:
    async with async_client(stack) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.post("/vector_stores/vs_us_x/file_batches", cast_to=object, body=body)
        assert caught.value.param == param


async def test_file_batches_of_another_tenant_or_store_are_not_found(stack: Stack) -> None:
    owner_key = await new_tenant(stack, "batch-owner")
    async with async_client(stack, owner_key) as owner:
        ids = await _upload(owner)
        store = await owner.vector_stores.create(name="mine")
        elsewhere = await owner.vector_stores.create(name="other")
        batch = await owner.vector_stores.file_batches.create(store.id, file_ids=[ids["japan.txt"]])
        with pytest.raises(openai.NotFoundError) as caught:
            await owner.vector_stores.file_batches.retrieve(batch.id, vector_store_id=elsewhere.id)
        assert caught.value.code == "vector_store_file_batch_not_found"
        with pytest.raises(openai.BadRequestError) as refused:
            await owner.get(
                f"/vector_stores/{store.id}/file_batches/{batch.id}/files",
                cast_to=object,
                options={"params": {"before": batch.id}},
            )
        assert refused.value.param == "before"
        rival_key = await new_tenant(stack, "batch-rival")
        async with async_client(stack, rival_key) as rival:
            for attempt in (
                rival.vector_stores.file_batches.retrieve(batch.id, vector_store_id=store.id),
                rival.vector_stores.file_batches.cancel(batch.id, vector_store_id=store.id),
                rival.vector_stores.file_batches.create(store.id, file_ids=[ids["rust.txt"]]),
            ):
                with pytest.raises(openai.NotFoundError):
                    await attempt
            with pytest.raises(openai.NotFoundError):
                await rival.vector_stores.file_batches.list_files(batch.id, vector_store_id=store.id)
            theirs = await rival.vector_stores.create(name="theirs")
            with pytest.raises(openai.NotFoundError) as caught:
                await rival.vector_stores.file_batches.create(theirs.id, file_ids=[ids["rust.txt"]])
            assert caught.value.code == "file_not_found"
        assert (await owner.vector_stores.retrieve(store.id)).file_counts.total == 1


async def test_the_region_refuses_file_batches_with_rich_statuses(stack: Stack) -> None:
    owner, rival = await new_tenant(stack, "grpc-batch-owner"), await new_tenant(stack, "grpc-batch-rival")
    async with open_channel(stack.region.address) as channel:
        rpc = retrieval_service_pb2_grpc.RetrievalServiceStub(channel)

        def auth(key: str) -> tuple[tuple[str, str]]:
            return (("authorization", f"Bearer {key}"),)

        made = await rpc.CreateFile(
            rpb.CreateFileRequest(filename="a.txt", purpose="assistants", content=b"Oslo is in Norway."),
            metadata=auth(owner),
        )
        store = await rpc.CreateVectorStore(rpb.CreateVectorStoreRequest(name="s"), metadata=auth(owner))
        store_id = store.vector_store.id
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await rpc.CreateVectorStoreFileBatch(
                rpb.CreateVectorStoreFileBatchRequest(vector_store_id=store_id), metadata=auth(owner)
            )
        refused = from_rpc_error(caught.value)
        assert refused.code == grpc.StatusCode.INVALID_ARGUMENT and refused.metadata["param"] == "file_ids"
        one = rpb.VectorStoreFileBatchFile(file_id=made.file.id)
        batch = await rpc.CreateVectorStoreFileBatch(
            rpb.CreateVectorStoreFileBatchRequest(vector_store_id=store_id, files=[one]), metadata=auth(owner)
        )
        assert (batch.batch.status, batch.batch.file_counts.completed) == ("completed", 1)
        ask = rpb.GetVectorStoreFileBatchRequest(vector_store_id=store_id, batch_id=batch.batch.id)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await rpc.GetVectorStoreFileBatch(ask, metadata=auth(rival))
        hidden = from_rpc_error(caught.value)
        assert (hidden.code, hidden.reason) == (grpc.StatusCode.NOT_FOUND, "VECTOR_STORE_NOT_FOUND")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await rpc.CancelVectorStoreFileBatch(
                rpb.CancelVectorStoreFileBatchRequest(vector_store_id=store_id, batch_id=batch.batch.id),
                metadata=auth(owner),
            )
        assert from_rpc_error(caught.value).code == grpc.StatusCode.FAILED_PRECONDITION
