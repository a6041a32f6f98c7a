"""A client of a region's ``ChatService``, for gRPC streaming clients.

::

    async with ChatClient.from_mesh_file() as client:
        async for event in client.stream_chat([Message("user", "Hello!")]):
            if isinstance(event, TextDelta):
                print(event.text, end="", flush=True)

A turn's events come typed and in stream order: :class:`Started`, then
:class:`TextDelta` (sequence 1, 2, … with no gaps) mixed with
:class:`SafetyVerdict`, then :class:`Usage` and :class:`Finished`, the last
event. A turn that fails raises a :class:`~llmmesh.errors.MeshError`
subclass, whether the region rejected the call (``UNAUTHENTICATED``,
``RESOURCE_EXHAUSTED`` …), sent an error event mid-stream, or the stream
broke (``UNAVAILABLE``). :meth:`ChatTurn.cancel` stops a running turn: the
region ends it as usual, with its usage (the tokens produced are billed) and
``Finished(reason="cancelled")``. Nothing is retried automatically.

The region's address and an API key come from the caller, or from
``$LLMMESH_HOME/mesh.json`` as ``llmmesh up`` writes it
(:func:`read_mesh_file`). Regions talk mutual TLS: the client presents the
mesh's ``client`` certificate (``$LLMMESH_HOME/certs/client.pem`` unless the
mesh file or the caller says otherwise, :class:`MeshTls`) and expects the
region to answer to ``region.llmmesh``; plaintext is only for a mesh started
with ``--insecure``. :class:`SyncChatClient` offers the same calls to code
without an event loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeAlias

import grpc
import grpc.aio
from google.protobuf import timestamp_pb2

from llmmesh.core.errors import Cancelled, MeshError, Reason, Unavailable, from_rpc_error, from_stream_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.core.home import mesh_home
from llmmesh.core.identity import Role, role_name
from llmmesh.core.mtls import MeshSecurity, TlsSetupError, holder_security
from llmmesh.core.pages import collect_pages
from llmmesh.v1 import chat_service_pb2 as pb
from llmmesh.v1 import chat_service_pb2_grpc as pb_grpc
from llmmesh.v1 import common_pb2

CALL_TIMEOUT_S = 10.0
REGION_SERVER_NAME = role_name(Role.REGION)
"""The name every region's certificate answers to."""
_ROLES = {
    "system": common_pb2.CHAT_ROLE_SYSTEM,
    "user": common_pb2.CHAT_ROLE_USER,
    "assistant": common_pb2.CHAT_ROLE_ASSISTANT,
    "developer": common_pb2.CHAT_ROLE_DEVELOPER,
    "tool": common_pb2.CHAT_ROLE_TOOL,
}
_ROLE_NAMES = {value: name for name, value in _ROLES.items()}


def _enum_name(full: str, prefix: str) -> str:
    """``FINISH_REASON_CONTENT_FILTER`` → ``content_filter``."""
    return full.removeprefix(prefix).lower()


def finish_reason_name(reason: common_pb2.FinishReason.ValueType) -> str:
    """A finish reason as OpenAI spells it: stop, length, content_filter, cancelled, error."""
    return _enum_name(common_pb2.FinishReason.Name(reason), "FINISH_REASON_")


def _time(stamp: timestamp_pb2.Timestamp) -> datetime:
    return stamp.ToDatetime(tzinfo=UTC)


def _cost(text: str) -> Decimal:
    return Decimal(text) if text else Decimal(0)


# ------------------------------------------------------------------ messages and events


@dataclass(frozen=True)
class Message:
    """One message of a turn; ``role`` is system, user, assistant, developer or tool."""

    role: str
    content: str

    def to_proto(self) -> common_pb2.ChatMessage:
        role = _ROLES.get(self.role)
        if role is None:
            raise ValueError(f"unknown role {self.role!r}; one of {', '.join(_ROLES)}")
        return common_pb2.ChatMessage(role=role, content=self.content)


@dataclass(frozen=True)
class Started:
    """The region admitted the turn and placed it on an engine pod."""

    request_id: str
    region: str
    zone: str
    pod_id: str
    model: str
    conversation_id: str


@dataclass(frozen=True)
class TextDelta:
    """New output: ``sequence`` counts deltas from 1, ``token_ids`` are the new tokens."""

    sequence: int
    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class SafetyVerdict:
    """A safety filter's verdict; ``stage`` is input or output."""

    stage: str
    flagged: bool
    categories: tuple[str, ...]
    blocked: bool


@dataclass(frozen=True)
class Usage:
    """Token counts and cost of the turn, everything delivered counted."""

    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    cost_usd: Decimal


@dataclass(frozen=True)
class Finished:
    """The turn ended: ``reason`` is stop, length, content_filter or cancelled;
    ``message_id`` names the stored reply when the turn belongs to a conversation."""

    reason: str
    message_id: str


ChatEvent: TypeAlias = Started | TextDelta | SafetyVerdict | Usage | Finished


def chat_event(response: pb.ChatResponse) -> ChatEvent:
    """The typed event of one ``ChatResponse``; an ``error`` event raises its MeshError."""
    kind = response.WhichOneof("event")
    if kind == "started":
        s = response.started
        return Started(s.request_id, s.region, s.zone, s.pod_id, s.model, s.conversation_id)
    if kind == "delta":
        d = response.delta
        return TextDelta(d.sequence, d.text, tuple(d.token_ids))
    if kind == "safety":
        v = response.safety
        stage = _enum_name(pb.SafetyStage.Name(v.stage), "SAFETY_STAGE_")
        return SafetyVerdict(stage, v.flagged, tuple(v.categories), v.blocked)
    if kind == "usage":
        u = response.usage
        return Usage(
            u.usage.input_tokens, u.usage.output_tokens, u.usage.cached_input_tokens, _cost(u.cost_usd)
        )
    if kind == "finished":
        return Finished(finish_reason_name(response.finished.reason), response.finished.message_id)
    if kind == "error":
        raise from_stream_error(response.error)
    raise Unavailable(Reason.REGION_UNAVAILABLE, f"the region sent an event of unknown kind {kind!r}")


# ------------------------------------------------------------------ conversations


@dataclass(frozen=True)
class Conversation:
    """A conversation stored in its zone; ``delete_time`` is set once soft-deleted."""

    id: str
    title: str
    model: str
    system_prompt: str
    zone: str
    home_region: str
    create_time: datetime
    update_time: datetime
    delete_time: datetime | None

    @classmethod
    def from_proto(cls, c: pb.Conversation) -> Conversation:
        deleted = _time(c.delete_time) if c.HasField("delete_time") else None
        return cls(
            c.id, c.title, c.model, c.system_prompt, c.zone, c.home_region,
            _time(c.create_time), _time(c.update_time), deleted,
        )  # fmt: skip


@dataclass(frozen=True)
class StoredMessage:
    """One stored message; the token counts, cost, model and finish reason
    are those of the turn that wrote it (assistant messages)."""

    id: str
    role: str
    content: str
    model: str
    request_id: str
    input_tokens: int
    output_tokens: int
    cost_usd: Decimal
    finish_reason: str
    create_time: datetime

    @classmethod
    def from_proto(cls, m: pb.StoredMessage) -> StoredMessage:
        return cls(
            m.id, _ROLE_NAMES.get(m.role, "unspecified"), m.content, m.model, m.request_id,
            m.input_tokens, m.output_tokens, _cost(m.cost_usd), finish_reason_name(m.finish_reason),
            _time(m.create_time),
        )  # fmt: skip


# ------------------------------------------------------------------ mesh.json and certificates


class MeshFileError(Exception):
    """``mesh.json`` is missing, unreadable or lacks what was asked for."""


class CertificateSetupError(Exception):
    """A tool has no usable certificate to present; the message says how to get one."""


def default_certs_dir() -> Path:
    return mesh_home() / "certs"


@dataclass(frozen=True)
class MeshTls:
    """How a tool reaches the planes: mutual TLS with the certificates in
    ``certs_dir`` (default ``$LLMMESH_HOME/certs``), or plaintext when
    ``insecure`` (a mesh started with ``--insecure``)."""

    insecure: bool = False
    certs_dir: Path | None = None

    @classmethod
    def from_flags(cls, insecure: bool, certs_dir: str | Path | None, fallback: MeshTls | None) -> MeshTls:
        """What ``--insecure`` and ``--certs-dir`` ask for; what they leave
        open comes from ``fallback`` (a mesh file's entry), else the default."""
        if insecure:
            return cls(insecure=True)
        if certs_dir:
            return cls(certs_dir=Path(certs_dir))
        return fallback if fallback is not None else cls()

    @property
    def directory(self) -> Path | None:
        """The certificate directory; None for plaintext."""
        return None if self.insecure else self.certs_dir or default_certs_dir()

    @classmethod
    def from_json(cls, entry: object) -> MeshTls:
        """``mesh.json``'s ``tls`` entry; a file without one means the default, mTLS."""
        if entry is None:
            return cls()
        if not isinstance(entry, dict):
            raise ValueError(f"tls must be an object, got {entry!r:.80}")
        directory = entry.get("certs_dir")
        return cls(bool(entry.get("insecure", False)), Path(directory) if directory else None)

    def security(self, holder: str) -> MeshSecurity:
        """The security of a tool holding certificate ``holder`` (``admin``,
        ``client``); CertificateSetupError, in one line, when it is missing
        or unusable."""
        directory = self.directory
        if directory is None:
            return MeshSecurity.insecure()
        fix = f"`llmmesh certs issue {holder}"
        fix += "`" if directory == default_certs_dir() else f" --dir {directory}`"
        names = (f"{holder}.pem", f"{holder}.key", "ca.pem")
        missing = [name for name in names if not (directory / name).is_file()]
        if missing:
            raise CertificateSetupError(
                f"no {holder} certificate in {directory} ({', '.join(missing)} missing): issue one with "
                f"{fix}, or pass --insecure if the mesh runs plaintext"
            )
        try:
            return holder_security(holder, directory=directory)
        except (TlsSetupError, OSError, ValueError) as err:
            detail = " ".join(str(err).split())
            raise CertificateSetupError(
                f"the {holder} certificate in {directory} is unusable ({detail}); re-issue it with {fix}"
            ) from None


@dataclass(frozen=True)
class MeshRegion:
    """A region of the local mesh and its ``ChatService`` address."""

    name: str
    zone: str
    address: str


@dataclass(frozen=True)
class LocalMesh:
    """What ``llmmesh up`` wrote to ``mesh.json``."""

    path: Path
    edge_url: str
    api_key: str
    global_address: str
    regions: tuple[MeshRegion, ...]
    tls: MeshTls = MeshTls()
    """How tools reach its planes (its ``tls`` entry)."""

    def region(self, name: str | None = None) -> MeshRegion:
        """The region called ``name``, or the first one."""
        for region in self.regions:
            if name is None or region.name == name:
                return region
        wanted = f"a region {name!r}" if name else "a region"
        raise MeshFileError(f"{self.path} names no {wanted}")


def read_mesh_file(path: Path | None = None) -> LocalMesh:
    """Read ``path``, by default ``$LLMMESH_HOME/mesh.json``."""
    path = path or mesh_home() / "mesh.json"
    try:
        data = json.loads(path.read_text())
        regions = tuple(
            MeshRegion(str(r["region"]), str(r.get("zone", "")), str(r["address"]))
            for r in data.get("regions", ())
        )
        return LocalMesh(
            path,
            str(data.get("edge_url", "")),
            str(data.get("api_key", "")),
            str(data.get("global_address", "")),
            regions,
            MeshTls.from_json(data.get("tls")),
        )
    except FileNotFoundError:
        raise MeshFileError(f"no {path}: start a mesh with `llmmesh up`, or give addresses") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise MeshFileError(f"cannot read {path}: {err}") from None


# ------------------------------------------------------------------ the client


class ChatTurn:
    """One running chat turn: an async iterator of its :data:`ChatEvent`.

    The call opens when iteration begins. ``text``, ``started``, ``usage``
    and ``finished`` collect what has streamed so far. Close the turn (or use
    it as an async context manager) when leaving it before its end.
    """

    def __init__(
        self,
        stub: pb_grpc.ChatServiceAsyncStub,
        start: pb.ChatStart,
        metadata: tuple[tuple[str, str], ...],
        timeout_s: float | None,
    ) -> None:
        self._stub = stub
        self._start = start
        self._metadata = metadata
        self._timeout_s = timeout_s
        self._call: Any = None  # a grpc.aio StreamStreamCall once open
        self._writing = asyncio.Lock()
        self._ended = False
        self._cancelled_before_start = False
        self._cancel_sent = False
        self._text: list[str] = []
        self.started: Started | None = None
        self.usage: Usage | None = None
        self.finished: Finished | None = None

    @property
    def text(self) -> str:
        """The reply text streamed so far."""
        return "".join(self._text)

    def __aiter__(self) -> ChatTurn:
        return self

    async def __anext__(self) -> ChatEvent:
        if self._ended:
            raise StopAsyncIteration
        if self._cancelled_before_start:
            self._ended = True
            raise Cancelled("CANCELLED", "the turn was cancelled before it started")
        await self._open()
        # read(), never `async for`: grpc.aio does not allow both on one call.
        try:
            response = await self._call.read()
        except grpc.aio.AioRpcError as err:
            self._ended = True
            raise from_rpc_error(err) from err
        if response is grpc.aio.EOF:
            self._ended = True
            if self.finished is None:
                raise Unavailable(
                    Reason.REGION_UNAVAILABLE,
                    "the region stream ended without a finish event",
                    retry_after_s=1.0,
                )
            raise StopAsyncIteration
        try:
            event = chat_event(response)
        except MeshError:
            self._ended = True
            self.close()
            raise
        if isinstance(event, Started):
            self.started = event
        elif isinstance(event, TextDelta):
            self._text.append(event.text)
        elif isinstance(event, Usage):
            self.usage = event
        elif isinstance(event, Finished):
            self.finished = event
        return event

    async def _open(self) -> None:
        async with self._writing:
            if self._call is not None:
                return
            self._call = self._stub.Chat(metadata=self._metadata, timeout=self._timeout_s)
            # The write side stays open: a cancel may follow the start.
            try:
                await self._call.write(pb.ChatRequest(start=self._start))
            except grpc.aio.AioRpcError as err:
                self._ended = True
                raise from_rpc_error(err) from err

    async def cancel(self, reason: str = "") -> None:
        """Ask the region to stop the turn. Iteration goes on to the turn's
        usage and ``Finished(reason="cancelled")``; a turn not yet begun
        raises :class:`~llmmesh.errors.Cancelled` when iterated instead.
        Once asked (or once the turn has its usage or ended), a cancel does
        nothing more: a second message could reach a stream the region is
        closing, which gRPC fails."""
        async with self._writing:
            if self._call is None:
                self._cancelled_before_start = True
                return
            if self._cancel_sent or self._ended or self.usage is not None or self._call.done():
                return
            self._cancel_sent = True
            try:
                await self._call.write(pb.ChatRequest(cancel=pb.ChatCancel(reason=reason)))
            except (grpc.aio.AioRpcError, grpc.aio.UsageError):
                # The stream is going away anyway; make sure it does.
                self._call.cancel()

    def close(self) -> None:
        """Drop the call if it is still open; the region aborts the turn (and bills it)."""
        if self._call is not None and not self._call.done():
            self._call.cancel()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class ChatClient:
    """The ``ChatService`` of the region at ``address`` (``host:port``),
    called with ``api_key``. Unary calls are bounded by ``call_timeout_s``;
    turns by their own ``timeout_s`` (none by default). Create it inside a
    running event loop; close it (or use ``async with``) when done.

    ``security`` is how to reach the region: by default the ``client``
    certificate of ``$LLMMESH_HOME/certs`` (:class:`CertificateSetupError`
    when there is none), ``MeshSecurity.insecure()`` for a plaintext mesh.
    The region must present a certificate naming ``server_name``."""

    def __init__(
        self,
        address: str,
        api_key: str,
        *,
        security: MeshSecurity | None = None,
        server_name: str = REGION_SERVER_NAME,
        call_timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        self.address = address
        self.security = security if security is not None else MeshTls().security("client")
        self._channel = open_channel(address, self.security, server_name)
        self._stub: pb_grpc.ChatServiceAsyncStub = pb_grpc.ChatServiceStub(self._channel)  # type: ignore[assignment]
        self._metadata = (("authorization", f"Bearer {api_key}"),)
        self._call_timeout_s = call_timeout_s

    @classmethod
    def from_mesh_file(
        cls, path: Path | None = None, *, region: str | None = None, api_key: str | None = None
    ) -> ChatClient:
        """A client of a region of the local mesh (the first, or ``region``),
        with the mesh's dev API key unless ``api_key`` is given, reaching it
        as the mesh file's ``tls`` entry says. Raises :class:`MeshFileError`
        or :class:`CertificateSetupError`."""
        mesh = read_mesh_file(path)
        key = api_key or mesh.api_key
        if not key:
            raise MeshFileError(f"{mesh.path} names no api_key")
        return cls(mesh.region(region).address, key, security=mesh.tls.security("client"))

    def stream_chat(
        self,
        messages: Sequence[Message],
        model: str = "auto",
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        conversation_id: str = "",
        request_id: str = "",
        ignore_eos: bool = False,
        timeout_s: float | None = None,
    ) -> ChatTurn:
        """Start a turn; iterate the result for its events. With
        ``conversation_id``, ``messages`` are only the new ones: the region
        puts the stored history before them and stores the turn.
        ``request_id`` is the turn's idempotency key (the region picks one
        when empty); ``ignore_eos`` generates to ``max_tokens`` whatever the
        model says (replies of a fixed length, for benchmarks and tests)."""
        sampling = common_pb2.SamplingParams(ignore_eos=ignore_eos)
        if max_tokens is not None:
            sampling.max_tokens = max_tokens
        if temperature is not None:
            sampling.temperature = temperature
        start = pb.ChatStart(
            request_id=request_id,
            model=model,
            messages=[message.to_proto() for message in messages],
            sampling=sampling,
            conversation_id=conversation_id,
        )
        return ChatTurn(self._stub, start, self._metadata, timeout_s)

    async def _unary(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, metadata=self._metadata, timeout=self._call_timeout_s)
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err) from err

    async def create_conversation(
        self, *, title: str = "", model: str = "", system_prompt: str = ""
    ) -> Conversation:
        """A new empty conversation homed in this region; ``model`` empty or
        "auto" takes the tier's default."""
        request = pb.CreateConversationRequest(title=title, model=model, system_prompt=system_prompt)
        response: pb.CreateConversationResponse = await self._unary(self._stub.CreateConversation, request)
        return Conversation.from_proto(response.conversation)

    async def get_conversation(self, conversation_id: str) -> Conversation:
        """One conversation of the key's tenant; NotFound when it is not."""
        request = pb.GetConversationRequest(conversation_id=conversation_id)
        response: pb.GetConversationResponse = await self._unary(self._stub.GetConversation, request)
        return Conversation.from_proto(response.conversation)

    async def list_conversations(self) -> list[Conversation]:
        """Every conversation of the key's tenant, newest first."""

        async def page(token: str) -> tuple[Sequence[pb.Conversation], str]:
            request = pb.ListConversationsRequest(page_size=100, page_token=token)
            response: pb.ListConversationsResponse = await self._unary(self._stub.ListConversations, request)
            return response.conversations, response.next_page_token

        return [Conversation.from_proto(c) for c in await collect_pages(page)]

    async def list_messages(self, conversation_id: str) -> list[StoredMessage]:
        """Every stored message of a conversation, oldest first."""

        async def page(token: str) -> tuple[Sequence[pb.StoredMessage], str]:
            request = pb.ListMessagesRequest(conversation_id=conversation_id, page_size=500, page_token=token)
            response: pb.ListMessagesResponse = await self._unary(self._stub.ListMessages, request)
            return response.messages, response.next_page_token

        return [StoredMessage.from_proto(m) for m in await collect_pages(page)]

    async def delete_conversation(self, conversation_id: str) -> Conversation:
        """Soft-delete a conversation; returns it with ``delete_time`` set."""
        request = pb.DeleteConversationRequest(conversation_id=conversation_id)
        response: pb.DeleteConversationResponse = await self._unary(self._stub.DeleteConversation, request)
        return Conversation.from_proto(response.conversation)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


# ------------------------------------------------------------------ without an event loop


class SyncChatTurn:
    """A :class:`ChatTurn` as a plain iterator of its events."""

    def __init__(self, runner: asyncio.Runner, turn: ChatTurn) -> None:
        self._runner = runner
        self.turn = turn

    def __iter__(self) -> Iterator[ChatEvent]:
        return self

    def __next__(self) -> ChatEvent:
        try:
            return self._runner.run(self.turn.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def cancel(self, reason: str = "") -> None:
        """See :meth:`ChatTurn.cancel`; call it between events."""
        self._runner.run(self.turn.cancel(reason))

    def close(self) -> None:
        self.turn.close()


class SyncChatClient:
    """:class:`ChatClient` for code without an event loop: every call runs
    on a private one. Not for use inside a running event loop."""

    def __init__(
        self,
        address: str,
        api_key: str,
        *,
        security: MeshSecurity | None = None,
        server_name: str = REGION_SERVER_NAME,
        call_timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        self._runner = asyncio.Runner()

        async def connect() -> ChatClient:
            return ChatClient(
                address, api_key, security=security, server_name=server_name, call_timeout_s=call_timeout_s
            )

        try:
            self.client = self._runner.run(connect())
        except BaseException:
            self._runner.close()
            raise

    def stream_chat(self, messages: Sequence[Message], model: str = "auto", **options: Any) -> SyncChatTurn:
        """See :meth:`ChatClient.stream_chat`."""
        return SyncChatTurn(self._runner, self.client.stream_chat(messages, model, **options))

    def create_conversation(
        self, *, title: str = "", model: str = "", system_prompt: str = ""
    ) -> Conversation:
        return self._runner.run(
            self.client.create_conversation(title=title, model=model, system_prompt=system_prompt)
        )

    def get_conversation(self, conversation_id: str) -> Conversation:
        return self._runner.run(self.client.get_conversation(conversation_id))

    def list_conversations(self) -> list[Conversation]:
        return self._runner.run(self.client.list_conversations())

    def list_messages(self, conversation_id: str) -> list[StoredMessage]:
        return self._runner.run(self.client.list_messages(conversation_id))

    def delete_conversation(self, conversation_id: str) -> Conversation:
        return self._runner.run(self.client.delete_conversation(conversation_id))

    def close(self) -> None:
        self._runner.run(self.client.close())
        self._runner.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
