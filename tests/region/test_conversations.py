"""The conversation RPCs: ConversationService on the zone store (embedded
SQLite and real PostgreSQL), and the ChatService methods on a running
in-process mesh."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import cast

import grpc
import grpc.aio
import pytest
import pytest_asyncio

from llmmesh.core import apikeys
from llmmesh.core.errors import (
    InvalidArgument,
    MeshError,
    NotFound,
    PermissionDenied,
    Reason,
    Unauthenticated,
    from_rpc_error,
)
from llmmesh.core.grpcserver import open_channel
from llmmesh.core.ids import ConversationId
from llmmesh.core.model_resolver import ModelResolver
from llmmesh.core.sqlstore import create_store_engine
from llmmesh.globalplane.tiers import TenantTier
from llmmesh.region.conversations import ConversationService, decode_message_position, encode_message_position
from llmmesh.region.policy_cache import PolicyCache
from llmmesh.region.settings import RegionSettings
from llmmesh.region.zone_store import AssistantMessage, ZoneStore
from llmmesh.v1 import (
    chat_service_pb2,
    chat_service_pb2_grpc,
    common_pb2,
    model_registry_service_pb2,
    policy_service_pb2,
    policy_service_pb2_grpc,
)
from tests.stack import DEV_KEY, Stack, running_stack

pytestmark = pytest.mark.asyncio

KEY_A, KEY_B = "sk-tenant-a", "sk-tenant-b"
TENANT_A = policy_service_pb2.Tenant(id="ten_a", name="a", zone="eu", tier=common_pb2.TIER_PRO)
TENANT_B = policy_service_pb2.Tenant(
    id="ten_b", name="b", zone="eu", tier=common_pb2.TIER_FREE, allowed_models=["llmmesh-tiny"]
)
MODELS = {
    "llmmesh-tiny": model_registry_service_pb2.Model(
        name="llmmesh-tiny", pricing=model_registry_service_pb2.ModelPricing(input_per_1k_usd="0.0005")
    ),
    "llmmesh-large": model_registry_service_pb2.Model(name="llmmesh-large"),
}
ALIASES = {"tiny-latest": "llmmesh-tiny"}
DELETED_AT = datetime(2031, 6, 1, 9, 30, tzinfo=UTC)


class SnapshotStub:
    """PolicyService as far as the policy cache asks it: one fixed snapshot."""

    async def GetPolicySnapshot(
        self, request: policy_service_pb2.GetPolicySnapshotRequest, **options: object
    ) -> policy_service_pb2.GetPolicySnapshotResponse:
        keys = [
            policy_service_pb2.KeyRecord(
                key_id=f"key_{n}", tenant_id=tenant.id, secret_sha256=apikeys.hash_secret(s)
            )
            for n, (tenant, s) in enumerate(((TENANT_A, KEY_A), (TENANT_B, KEY_B)))
        ]
        snapshot = policy_service_pb2.PolicySnapshot(
            version=1, zone="eu", tenants=[TENANT_A, TENANT_B], keys=keys
        )
        return policy_service_pb2.GetPolicySnapshotResponse(snapshot=snapshot)


class CatalogModels(ModelResolver):
    """The model registry's answers for a fixed catalog."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def resolve(self, name: str, tier: common_pb2.Tier.ValueType) -> model_registry_service_pb2.Model:
        self.asked.append(name)
        model = MODELS.get(ALIASES.get(name, name))
        if model is None:
            raise NotFound(Reason.UNKNOWN_MODEL, f"unknown model {name!r}", metadata={"param": "model"})
        return model


class StepClock:
    """Each reading one second after the last, so creation order is listing order."""

    def __init__(self) -> None:
        self.now = datetime(2031, 5, 17, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def store(request: pytest.FixtureRequest) -> Iterator[ZoneStore]:
    url = "sqlite://" if request.param == "sqlite" else request.getfixturevalue("postgres_schema_url")
    opened = ZoneStore(create_store_engine(url), "eu", "eu-west", clock=StepClock())
    opened.create_schema()
    yield opened
    opened.dispose()


@pytest_asyncio.fixture
async def service(store: ZoneStore) -> ConversationService:
    policy = PolicyCache(cast(policy_service_pb2_grpc.PolicyServiceStub, SnapshotStub()), "eu", 60.0, 600.0)
    assert await policy.refresh()
    settings = RegionSettings(region="eu-west", zone="eu", max_message_chars=1000)
    return ConversationService(policy, store, CatalogModels(), settings, clock=lambda: DELETED_AT)


async def create(
    service: ConversationService, key: str = KEY_A, **fields: str
) -> chat_service_pb2.Conversation:
    request = chat_service_pb2.CreateConversationRequest(**fields)
    return (await service.create(request, key)).conversation


async def error_of(call: Awaitable[object]) -> MeshError:
    with pytest.raises(MeshError) as info:
        await call
    return info.value


def reply(words: str, output_tokens: int = 3) -> AssistantMessage:
    return AssistantMessage(
        content=words,
        model="llmmesh-tiny",
        finish_reason="FINISH_REASON_STOP",
        input_tokens=10,
        output_tokens=output_tokens,
        cost_usd=Decimal("0.000012345678901234567"),
    )


# ---------------------------------------------------------------- ConversationService


async def test_create_then_get_returns_the_stored_conversation(service: ConversationService) -> None:
    made = await create(service, title="Fruit", model="tiny-latest", system_prompt="Answer briefly.")
    parsed = ConversationId.parse(made.id)
    assert parsed is not None and (parsed.zone, parsed.home_region) == ("eu", "eu-west")
    assert (made.tenant_id, made.title, made.model, made.system_prompt) == (
        "ten_a",
        "Fruit",
        "llmmesh-tiny",
        "Answer briefly.",
    )
    assert (made.zone, made.home_region) == ("eu", "eu-west")
    assert made.create_time.ToDatetime(UTC) == made.update_time.ToDatetime(UTC)
    assert not made.HasField("delete_time")
    got = await service.get(chat_service_pb2.GetConversationRequest(conversation_id=made.id), KEY_A)
    assert got.conversation == made


async def test_a_conversation_without_a_model_follows_the_tier_default(service: ConversationService) -> None:
    assert (await create(service)).model == "auto"
    assert (await create(service, model="auto")).model == "auto"


async def test_models_are_checked_when_named(service: ConversationService) -> None:
    unknown = await error_of(create(service, model="no-such-model"))
    assert isinstance(unknown, NotFound) and unknown.reason == Reason.UNKNOWN_MODEL
    refused = await error_of(create(service, KEY_B, model="llmmesh-large"))
    assert isinstance(refused, PermissionDenied) and refused.reason == Reason.MODEL_NOT_ALLOWED
    assert (await create(service, KEY_B, model="llmmesh-tiny")).model == "llmmesh-tiny"


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"title": "t" * 257}, "title"), ({"system_prompt": "s" * 1001}, "system_prompt")],
)
async def test_over_long_fields_are_invalid(
    service: ConversationService, fields: dict[str, str], param: str
) -> None:
    error = await error_of(create(service, **fields))
    assert isinstance(error, InvalidArgument)
    assert error.metadata["param"] == param


async def test_every_call_needs_a_valid_key(service: ConversationService) -> None:
    missing = await error_of(service.list(chat_service_pb2.ListConversationsRequest(), None))
    assert isinstance(missing, Unauthenticated) and missing.reason == Reason.API_KEY_MISSING
    invalid = await error_of(create(service, "sk-nobody"))
    assert isinstance(invalid, Unauthenticated) and invalid.reason == Reason.API_KEY_INVALID


async def test_listing_pages_newest_first_without_repeats(service: ConversationService) -> None:
    made = [await create(service, title=f"c{n}") for n in range(5)]
    await create(service, KEY_B, title="not a's")
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = await service.list(
            chat_service_pb2.ListConversationsRequest(page_size=2, page_token=token), KEY_A
        )
        pages += 1
        assert len(page.conversations) <= 2
        seen.extend(c.title for c in page.conversations)
        token = page.next_page_token
        if not token:
            break
    assert pages == 3
    assert seen == [c.title for c in reversed(made)]
    everything = await service.list(chat_service_pb2.ListConversationsRequest(), KEY_A)
    assert [c.id for c in everything.conversations] == [c.id for c in reversed(made)]
    assert not everything.next_page_token


async def test_listing_defaults_to_20_and_clamps_at_100(service: ConversationService) -> None:
    for n in range(21):
        await create(service, title=f"c{n}")
    first = await service.list(chat_service_pb2.ListConversationsRequest(), KEY_A)
    assert len(first.conversations) == 20 and first.next_page_token
    big = await service.list(chat_service_pb2.ListConversationsRequest(page_size=10_000), KEY_A)
    assert len(big.conversations) == 21 and not big.next_page_token


@pytest.mark.parametrize(
    ("request_", "param"),
    [
        (chat_service_pb2.ListConversationsRequest(page_size=-1), "page_size"),
        (chat_service_pb2.ListConversationsRequest(page_token="not a token!"), "page_token"),
        (chat_service_pb2.ListConversationsRequest(page_token="bm90aGluZw=="), "page_token"),
    ],
)
async def test_bad_list_requests_are_invalid(
    service: ConversationService, request_: chat_service_pb2.ListConversationsRequest, param: str
) -> None:
    error = await error_of(service.list(request_, KEY_A))
    assert isinstance(error, InvalidArgument)
    assert (error.reason, error.metadata["param"]) == (Reason.INVALID_REQUEST, param)


async def test_messages_page_oldest_first_with_counts_and_cost(
    service: ConversationService, store: ZoneStore
) -> None:
    conversation = await create(service, model="llmmesh-tiny")
    for n in range(3):
        await store.record_turn(
            "ten_a", conversation.id, f"req-{n}", f"question {n}", reply(f"answer {n}"), b"u"
        )
    pages: list[chat_service_pb2.ListMessagesResponse] = []
    token = ""
    while True:
        request = chat_service_pb2.ListMessagesRequest(
            conversation_id=conversation.id, page_size=4, page_token=token
        )
        pages.append(await service.list_messages(request, KEY_A))
        token = pages[-1].next_page_token
        if not token:
            break
    assert [len(p.messages) for p in pages] == [4, 2]
    messages = [m for p in pages for m in p.messages]
    assert [m.content for m in messages] == [
        "question 0",
        "answer 0",
        "question 1",
        "answer 1",
        "question 2",
        "answer 2",
    ]
    user, assistant = messages[0], messages[1]
    assert user.role == common_pb2.CHAT_ROLE_USER
    assert (user.input_tokens, user.output_tokens, user.cost_usd, user.model) == (0, 0, "0", "")
    assert user.finish_reason == common_pb2.FINISH_REASON_UNSPECIFIED
    assert assistant.role == common_pb2.CHAT_ROLE_ASSISTANT
    assert (assistant.input_tokens, assistant.output_tokens) == (10, 3)
    assert assistant.cost_usd == "0.000012345678901234567"
    assert (assistant.model, assistant.request_id) == ("llmmesh-tiny", "req-0")
    assert assistant.finish_reason == common_pb2.FINISH_REASON_STOP
    assert assistant.create_time.ToDatetime(UTC) >= user.create_time.ToDatetime(UTC)
    assert all(m.conversation_id == conversation.id and m.id for m in messages)


async def test_a_message_token_belongs_to_its_conversation(service: ConversationService) -> None:
    one, other = await create(service), await create(service)
    token = encode_message_position(one.id, 4)
    assert decode_message_position(token, one.id) == 4
    for bad in (token, "%%%", encode_message_position(other.id, -3)):
        request = chat_service_pb2.ListMessagesRequest(conversation_id=other.id, page_token=bad)
        error = await error_of(service.list_messages(request, KEY_A))
        assert isinstance(error, InvalidArgument) and error.metadata["param"] == "page_token"
    negative = chat_service_pb2.ListMessagesRequest(conversation_id=one.id, page_size=-5)
    error = await error_of(service.list_messages(negative, KEY_A))
    assert isinstance(error, InvalidArgument) and error.metadata["param"] == "page_size"


async def test_delete_hides_the_conversation_from_every_read(service: ConversationService) -> None:
    kept, gone = await create(service, title="kept"), await create(service, title="gone")
    deleted = await service.delete(chat_service_pb2.DeleteConversationRequest(conversation_id=gone.id), KEY_A)
    assert deleted.conversation.id == gone.id
    assert deleted.conversation.delete_time.ToDatetime(UTC) == DELETED_AT
    for call in (
        service.get(chat_service_pb2.GetConversationRequest(conversation_id=gone.id), KEY_A),
        service.delete(chat_service_pb2.DeleteConversationRequest(conversation_id=gone.id), KEY_A),
        service.list_messages(chat_service_pb2.ListMessagesRequest(conversation_id=gone.id), KEY_A),
    ):
        error = await error_of(call)
        assert isinstance(error, NotFound) and error.reason == Reason.CONVERSATION_NOT_FOUND
    listed = await service.list(chat_service_pb2.ListConversationsRequest(), KEY_A)
    assert [c.id for c in listed.conversations] == [kept.id]


async def test_another_tenant_sees_nothing_it_could_tell_from_a_missing_id(
    service: ConversationService, store: ZoneStore
) -> None:
    mine = await create(service, title="secret")
    await store.record_turn("ten_a", mine.id, "req-a", "private question", reply("private answer"), b"u")
    never = str(ConversationId.new("eu", "eu-west"))

    async def answers(conversation_id: str) -> list[tuple[grpc.StatusCode, str, list[str]]]:
        calls = (
            service.get(chat_service_pb2.GetConversationRequest(conversation_id=conversation_id), KEY_B),
            service.list_messages(
                chat_service_pb2.ListMessagesRequest(conversation_id=conversation_id), KEY_B
            ),
            service.delete(
                chat_service_pb2.DeleteConversationRequest(conversation_id=conversation_id), KEY_B
            ),
        )
        seen = []
        for call in calls:
            error = await error_of(call)
            seen.append((error.code, error.reason, sorted(error.metadata)))
        return seen

    assert await answers(mine.id) == await answers(never)
    assert (await answers(mine.id))[0][:2] == (grpc.StatusCode.NOT_FOUND, Reason.CONVERSATION_NOT_FOUND)
    assert not (await service.list(chat_service_pb2.ListConversationsRequest(), KEY_B)).conversations
    # B's failed delete left A's conversation alone.
    still = await service.get(chat_service_pb2.GetConversationRequest(conversation_id=mine.id), KEY_A)
    assert (still.conversation.id, still.conversation.title) == (mine.id, "secret")


@pytest.mark.parametrize(
    ("conversation_id", "reason"),
    [
        ("", Reason.INVALID_REQUEST),
        ("conv_nonsense", Reason.INVALID_REQUEST),
        (str(ConversationId.new("us", "us-east")), Reason.WRONG_ZONE),
    ],
    # Ids that name the case, not the random id: every run (and every worker) collects the same tests.
    ids=["empty", "nonsense", "another-zone"],
)
async def test_ids_are_checked_before_the_store_is_asked(
    service: ConversationService, conversation_id: str, reason: Reason
) -> None:
    error = await error_of(
        service.get(chat_service_pb2.GetConversationRequest(conversation_id=conversation_id), KEY_A)
    )
    assert isinstance(error, InvalidArgument)
    assert (error.reason, error.metadata["param"]) == (reason, "conversation_id")


# ---------------------------------------------------------------- ChatService on a running mesh


@pytest_asyncio.fixture
async def stack() -> AsyncIterator[Stack]:
    async with running_stack() as running:
        yield running


@pytest_asyncio.fixture
async def other_key(stack: Stack) -> str:
    """The key of a second tenant of the stack's zone."""
    tenant = await stack.global_plane.tenants.create_tenant("other", "us", TenantTier.PRO)
    _, secret = await stack.global_plane.tenants.create_api_key(tenant.id)
    assert await stack.region.policy.refresh()
    return secret


def auth(key: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {key}"),)


async def rpc_error(call: Awaitable[object]) -> MeshError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return from_rpc_error(info.value)


async def test_conversations_over_grpc(stack: Stack, other_key: str) -> None:
    async with open_channel(stack.region.address) as channel:
        chat = chat_service_pb2_grpc.ChatServiceStub(channel)
        me, them = auth(DEV_KEY), auth(other_key)
        made = [
            (
                await chat.CreateConversation(
                    chat_service_pb2.CreateConversationRequest(title=f"t{n}", system_prompt="Be brief."),
                    metadata=me,
                )
            ).conversation
            for n in range(3)
        ]
        first = made[0]
        assert (first.zone, first.home_region, first.model) == ("us", "us-east", "auto")
        got = await chat.GetConversation(
            chat_service_pb2.GetConversationRequest(conversation_id=first.id), metadata=me
        )
        assert got.conversation == first

        page = await chat.ListConversations(
            chat_service_pb2.ListConversationsRequest(page_size=2), metadata=me
        )
        rest = await chat.ListConversations(
            chat_service_pb2.ListConversationsRequest(page_size=2, page_token=page.next_page_token),
            metadata=me,
        )
        assert [c.id for c in [*page.conversations, *rest.conversations]] == [c.id for c in reversed(made)]
        assert not rest.next_page_token

        # A turn in the conversation lands in its messages, with what it was billed.
        call = chat.Chat(metadata=me)
        await call.write(
            chat_service_pb2.ChatRequest(
                start=chat_service_pb2.ChatStart(
                    model="auto",
                    conversation_id=first.id,
                    messages=[common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content="Hello there.")],
                    sampling=common_pb2.SamplingParams(max_tokens=8),
                )
            )
        )
        await call.done_writing()
        events = [event async for event in call]
        usage = next(e.usage for e in events if e.HasField("usage"))
        finished = events[-1].finished
        listed = await chat.ListMessages(
            chat_service_pb2.ListMessagesRequest(conversation_id=first.id, page_size=1), metadata=me
        )
        assert [m.role for m in listed.messages] == [common_pb2.CHAT_ROLE_USER]
        assert listed.messages[0].content == "Hello there."
        more = await chat.ListMessages(
            chat_service_pb2.ListMessagesRequest(conversation_id=first.id, page_token=listed.next_page_token),
            metadata=me,
        )
        assert [m.role for m in more.messages] == [common_pb2.CHAT_ROLE_ASSISTANT]
        answer = more.messages[0]
        assert answer.id == finished.message_id
        assert answer.output_tokens == usage.usage.output_tokens > 0
        assert answer.cost_usd == usage.cost_usd
        assert answer.finish_reason == finished.reason

        # Another tenant learns nothing about it.
        for other_call in (
            chat.GetConversation(
                chat_service_pb2.GetConversationRequest(conversation_id=first.id), metadata=them
            ),
            chat.ListMessages(chat_service_pb2.ListMessagesRequest(conversation_id=first.id), metadata=them),
            chat.DeleteConversation(
                chat_service_pb2.DeleteConversationRequest(conversation_id=first.id), metadata=them
            ),
        ):
            error = await rpc_error(other_call)
            assert (error.code, error.reason) == (grpc.StatusCode.NOT_FOUND, Reason.CONVERSATION_NOT_FOUND)
        theirs = await chat.ListConversations(chat_service_pb2.ListConversationsRequest(), metadata=them)
        assert not theirs.conversations

        deleted = await chat.DeleteConversation(
            chat_service_pb2.DeleteConversationRequest(conversation_id=first.id), metadata=me
        )
        assert deleted.conversation.HasField("delete_time")
        gone = await rpc_error(
            chat.GetConversation(
                chat_service_pb2.GetConversationRequest(conversation_id=first.id), metadata=me
            )
        )
        assert (gone.code, gone.reason) == (grpc.StatusCode.NOT_FOUND, Reason.CONVERSATION_NOT_FOUND)


@pytest.mark.parametrize(
    ("request_", "param"),
    [
        (chat_service_pb2.ListConversationsRequest(page_size=-1), "page_size"),
        (chat_service_pb2.ListConversationsRequest(page_token="garbage"), "page_token"),
    ],
)
async def test_bad_pages_over_grpc_are_invalid_argument(
    stack: Stack, request_: chat_service_pb2.ListConversationsRequest, param: str
) -> None:
    async with open_channel(stack.region.address) as channel:
        chat = chat_service_pb2_grpc.ChatServiceStub(channel)
        error = await rpc_error(chat.ListConversations(request_, metadata=auth(DEV_KEY)))
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_REQUEST)
    assert error.metadata["param"] == param


async def test_unauthenticated_over_grpc(stack: Stack) -> None:
    async with open_channel(stack.region.address) as channel:
        chat = chat_service_pb2_grpc.ChatServiceStub(channel)
        error = await rpc_error(chat.ListConversations(chat_service_pb2.ListConversationsRequest()))
    assert (error.code, error.reason) == (grpc.StatusCode.UNAUTHENTICATED, Reason.API_KEY_MISSING)
