"""Files, vector stores and hybrid search through the edge, driven by the
official ``openai`` SDK over an in-process mesh: OpenAI's shapes, embedding
by the mesh's own model (billed), refusals naming their param, and tenants
that cannot see each other's files."""

from __future__ import annotations

import openai
import pytest

from tests.edge.sdk import async_client
from tests.edge.test_conversations_api import new_tenant
from tests.stack import Stack

pytestmark = pytest.mark.asyncio

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
