"""Conversation trees over the region's ChatService on a running in-process
mesh: regenerating a reply and editing a question make branches, any branch
can be continued, its history is what the engine sees, and the branches
and each one's messages are listed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from llmmesh.core.errors import MeshError, Reason, from_rpc_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.v1 import chat_service_pb2, chat_service_pb2_grpc, common_pb2
from tests.stack import DEV_KEY, Stack, running_stack

pytestmark = pytest.mark.asyncio

ME = (("authorization", f"Bearer {DEV_KEY}"),)
USER, ASSISTANT = common_pb2.CHAT_ROLE_USER, common_pb2.CHAT_ROLE_ASSISTANT
Chat = chat_service_pb2_grpc.ChatServiceStub


@pytest_asyncio.fixture
async def stack() -> AsyncIterator[Stack]:
    async with running_stack() as running:
        yield running


async def run(
    chat: Chat, conversation_id: str, text: str | None = None, **point: str
) -> list[chat_service_pb2.ChatResponse]:
    messages = [common_pb2.ChatMessage(role=USER, content=text)] if text is not None else []
    call = chat.Chat(metadata=ME)
    start = chat_service_pb2.ChatStart(
        model="auto",
        conversation_id=conversation_id,
        messages=messages,
        sampling=common_pb2.SamplingParams(max_tokens=6),
    )
    for field, message_id in point.items():
        setattr(start, field, message_id)
    await call.write(chat_service_pb2.ChatRequest(start=start))
    await call.done_writing()
    return [event async for event in call]


async def refused(chat: Chat, conversation_id: str, text: str | None = None, **point: str) -> MeshError:
    """The refusal of a turn, raised before it began (a status)."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await run(chat, conversation_id, text, **point)
    return from_rpc_error(info.value)


async def listed(
    chat: Chat, conversation_id: str, leaf_id: str = "", request_id: str = ""
) -> list[chat_service_pb2.StoredMessage]:
    request = chat_service_pb2.ListMessagesRequest(
        conversation_id=conversation_id, leaf_id=leaf_id, request_id=request_id
    )
    page = await chat.ListMessages(request, metadata=ME)
    return list(page.messages)


async def test_regenerate_and_edit_make_branches_that_can_each_be_continued(stack: Stack) -> None:
    async with open_channel(stack.region.address) as channel:
        chat = Chat(channel)
        conv = (
            await chat.CreateConversation(chat_service_pb2.CreateConversationRequest(), metadata=ME)
        ).conversation
        first = await run(chat, conv.id, "What is a mesh?")
        assert first[0].started.parent_message_id == ""
        second = await run(chat, conv.id, "And a region?")
        q1, a1, q2, a2 = await listed(chat, conv.id)
        assert second[0].started.parent_message_id == a1.id
        assert [m.parent_id for m in (q1, a1, q2, a2)] == ["", q1.id, a1.id, q2.id]

        # A new reply to the second question: a sibling of the old one, now the current branch.
        regenerated = await run(chat, conv.id, regenerate_message_id=a2.id)
        assert regenerated[-1].finished.message_id
        assert regenerated[0].started.parent_message_id == q2.id
        branch = await listed(chat, conv.id)
        assert [m.id for m in branch[:3]] == [q1.id, a1.id, q2.id]
        a2b = branch[3]
        assert (a2b.id, a2b.parent_id, a2b.role) == (regenerated[-1].finished.message_id, q2.id, ASSISTANT)
        assert len(branch) == 4  # the question is not stored again

        # An edit of the first question: a new first message, its own branch.
        await run(chat, conv.id, "What is a service mesh?", edit_message_id=q1.id)
        q1c, a1c = await listed(chat, conv.id)
        assert (q1c.content, q1c.parent_id, a1c.parent_id) == ("What is a service mesh?", "", q1c.id)

        branches = (
            await chat.ListBranches(
                chat_service_pb2.ListBranchesRequest(conversation_id=conv.id), metadata=ME
            )
        ).branches
        assert [(b.leaf_id, b.message_count, b.fork_id, b.current) for b in branches] == [
            (a1c.id, 2, "", True),
            (a2b.id, 4, q2.id, False),
            (a2.id, 4, "", False),
        ]
        page = await chat.ListBranches(
            chat_service_pb2.ListBranchesRequest(conversation_id=conv.id, page_size=2), metadata=ME
        )
        rest = await chat.ListBranches(
            chat_service_pb2.ListBranchesRequest(conversation_id=conv.id, page_token=page.next_page_token),
            metadata=ME,
        )
        assert [b.leaf_id for b in [*page.branches, *rest.branches]] == [b.leaf_id for b in branches]
        # Paged by ids: after a branch's leaf, the older branches.
        after = await chat.ListBranches(
            chat_service_pb2.ListBranchesRequest(conversation_id=conv.id, after_id=a1c.id), metadata=ME
        )
        assert [b.leaf_id for b in after.branches] == [a2b.id, a2.id] and not after.next_page_token
        for bad in (
            chat_service_pb2.ListBranchesRequest(conversation_id=conv.id, after_id=q1c.id),
            chat_service_pb2.ListBranchesRequest(
                conversation_id=conv.id, after_id=a1c.id, page_token=page.next_page_token
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await chat.ListBranches(bad, metadata=ME)
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT

        # The first branch goes on where asked, and is current again.
        await run(chat, conv.id, "And a zone?", parent_message_id=a2.id)
        old = await listed(chat, conv.id)
        assert [m.id for m in old[:4]] == [q1.id, a1.id, q2.id, a2.id]
        assert [m.content for m in old[4:5]] == ["And a zone?"]
        assert [m.id for m in await listed(chat, conv.id, leaf_id=a1c.id)] == [q1c.id, a1c.id]
        assert [m.id for m in await listed(chat, conv.id, request_id=q2.request_id)] == [q2.id, a2.id]


async def test_the_history_a_turn_sees_is_its_branch_only(stack: Stack) -> None:
    async with open_channel(stack.region.address) as channel:
        chat = Chat(channel)
        conv = (
            await chat.CreateConversation(chat_service_pb2.CreateConversationRequest(), metadata=ME)
        ).conversation
        await run(chat, conv.id, "alpha " * 20)
        (q1, a1) = await listed(chat, conv.id)
        await run(chat, conv.id, "beta", edit_message_id=q1.id)
        on_edit = await run(chat, conv.id, "gamma")
        on_old = await run(chat, conv.id, "gamma", parent_message_id=a1.id)
        # The prompts differ by the branch's history: the old branch's first question is long.
        usage_edit = next(e.usage.usage for e in on_edit if e.HasField("usage"))
        usage_old = next(e.usage.usage for e in on_old if e.HasField("usage"))
        assert usage_old.input_tokens > usage_edit.input_tokens + 15


async def test_branch_points_are_checked(stack: Stack) -> None:
    async with open_channel(stack.region.address) as channel:
        chat = Chat(channel)
        conv = (
            await chat.CreateConversation(chat_service_pb2.CreateConversationRequest(), metadata=ME)
        ).conversation
        await run(chat, conv.id, "hello")
        _, a1 = await listed(chat, conv.id)
        missing = await refused(chat, conv.id, regenerate_message_id="msg_nope")
        assert (missing.code, missing.reason) == (grpc.StatusCode.NOT_FOUND, Reason.MESSAGE_NOT_FOUND)
        cases = [
            ({"regenerate_message_id": a1.id}, "again", "messages"),
            ({"edit_message_id": a1.id}, "x", "edit_message_id"),
            ({"parent_message_id": "msg_nope"}, "x", "parent_message_id"),
        ]
        for point, text, param in cases:
            error = await refused(chat, conv.id, text, **point)
            assert (error.code, error.metadata.get("param")) == (grpc.StatusCode.INVALID_ARGUMENT, param)
        stateless = await refused(chat, "", "x", parent_message_id=a1.id)
        assert stateless.metadata.get("param") == "parent_message_id"
        bad_leaf = chat.ListMessages(
            chat_service_pb2.ListMessagesRequest(conversation_id=conv.id, leaf_id="msg_nope"), metadata=ME
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await bad_leaf
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(await listed(chat, conv.id)) == 2
