"""The ChatService client module and ``llmmesh chat`` against an in-process
mesh; the command runs as a real process while the mesh serves in this
event loop. Most tests run a plaintext mesh (and say so, ``--insecure``);
those of mutual TLS run one with certificates of a temporary mesh CA."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from llmmesh.client import (
    CertificateSetupError,
    ChatClient,
    ChatEvent,
    Finished,
    MeshFileError,
    MeshTls,
    Message,
    Started,
    SyncChatClient,
    TextDelta,
    Usage,
    read_mesh_file,
)
from llmmesh.core.errors import NotFound, Unauthenticated, Unavailable
from llmmesh.core.mtls import MeshSecurity
from tests.security.mesh_pki import CLIENT, secure_stack
from tests.stack import DEV_KEY, Stack, running_stack

pytestmark = pytest.mark.asyncio

BOUND_S = 60.0
LLMMESH = Path(sys.executable).with_name("llmmesh")
PROMPTS = ("Hello there, mesh.", "And what comes next?")
PLAINTEXT = MeshSecurity.insecure()


@pytest_asyncio.fixture
async def stack() -> AsyncIterator[Stack]:
    async with running_stack(with_edge=True) as running:
        yield running


@pytest_asyncio.fixture
async def client(stack: Stack) -> AsyncIterator[ChatClient]:
    async with ChatClient(stack.region.address, DEV_KEY, security=PLAINTEXT) as chat:
        yield chat


async def replies(client: ChatClient, prompts: tuple[str, ...], max_tokens: int) -> list[str]:
    """The replies a chat that keeps its own history gets for ``prompts``."""
    history: list[Message] = []
    texts = []
    for prompt in prompts:
        turn = client.stream_chat([*history, Message("user", prompt)], max_tokens=max_tokens)
        async with asyncio.timeout(BOUND_S):
            async for _ in turn:
                pass
        history += [Message("user", prompt), Message("assistant", turn.text)]
        texts.append(turn.text)
    return texts


# ------------------------------------------------------------------ the client module


async def test_a_turn_streams_typed_events_in_order(client: ChatClient) -> None:
    # Fewer tokens than the shortest natural reply: the turn ends on its length.
    turn = client.stream_chat([Message("system", "Be brief."), Message("user", "Hello!")], max_tokens=10)
    async with asyncio.timeout(BOUND_S):
        events: list[ChatEvent] = [event async for event in turn]
    assert isinstance(events[0], Started)
    assert (events[0].region, events[0].zone, events[0].pod_id) == ("us-east", "us", "us-east-pod-0")
    assert events[0].request_id and events[0].model == "llmmesh-tiny"
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert [d.sequence for d in deltas] == list(range(1, len(deltas) + 1))
    assert isinstance(events[-2], Usage) and isinstance(events[-1], Finished)
    assert events[-1].reason == "length"
    assert events[-2].output_tokens == sum(len(d.token_ids) for d in deltas) == 10
    assert events[-2].input_tokens > 0 and events[-2].cost_usd >= 0
    assert turn.text == "".join(d.text for d in deltas) != ""
    assert (turn.started, turn.usage, turn.finished) == (events[0], events[-2], events[-1])


async def test_cancel_stops_a_long_turn_which_still_reports_its_usage(client: ChatClient) -> None:
    turn = client.stream_chat([Message("user", "Tell me everything.")], max_tokens=2000, ignore_eos=True)
    events: list[ChatEvent] = []
    async with asyncio.timeout(BOUND_S):
        async for event in turn:
            events.append(event)
            # Asked again with every event after the second delta: once is what counts.
            if sum(isinstance(e, TextDelta) for e in events) >= 2:
                await turn.cancel("enough")
    assert turn.finished == Finished("cancelled", "")
    assert turn.usage is not None and 2 <= turn.usage.output_tokens < 2000
    assert turn.usage.output_tokens >= sum(len(e.token_ids) for e in events if isinstance(e, TextDelta))


async def test_errors_are_mesh_errors(stack: Stack, client: ChatClient) -> None:
    async with ChatClient(stack.region.address, "sk-llmmesh-wrong", security=PLAINTEXT) as stranger:
        with pytest.raises(Unauthenticated) as info:
            async for _ in stranger.stream_chat([Message("user", "Hello!")]):
                pass
        assert info.value.reason == "API_KEY_INVALID"
        with pytest.raises(Unauthenticated):
            await stranger.list_conversations()
    with pytest.raises(NotFound):
        await client.get_conversation("conv_us_us-east_0123456789abcdef")
    with pytest.raises(ValueError, match="unknown role"):
        client.stream_chat([Message("narrator", "Once upon a time")])


async def test_a_conversation_round_trip(client: ChatClient) -> None:
    made = await client.create_conversation(title="trip", system_prompt="Be brief.")
    assert (made.zone, made.home_region, made.delete_time) == ("us", "us-east", None)
    turn = client.stream_chat([Message("user", "Remember me.")], max_tokens=8, conversation_id=made.id)
    async with asyncio.timeout(BOUND_S):
        async for _ in turn:
            pass
    assert turn.started is not None and turn.started.conversation_id == made.id
    assert turn.finished is not None and turn.finished.message_id
    stored = await client.list_messages(made.id)
    assert [(m.role, m.content) for m in stored] == [("user", "Remember me."), ("assistant", turn.text)]
    assert stored[1].id == turn.finished.message_id and stored[1].output_tokens == 8
    assert (await client.get_conversation(made.id)).system_prompt == "Be brief."
    assert made.id in [c.id for c in await client.list_conversations()]
    deleted = await client.delete_conversation(made.id)
    assert deleted.delete_time is not None
    with pytest.raises(NotFound):
        await client.get_conversation(made.id)


async def test_the_sync_client_runs_a_turn_on_its_own_loop(stack: Stack) -> None:
    def chat() -> tuple[list[ChatEvent], int]:
        with SyncChatClient(stack.region.address, DEV_KEY, security=PLAINTEXT) as sync:
            events = list(sync.stream_chat([Message("user", "Hello!")], max_tokens=4))
            return events, len(sync.list_conversations())

    events, _ = await asyncio.wait_for(asyncio.to_thread(chat), BOUND_S)
    assert isinstance(events[0], Started) and events[-1] == Finished("length", "")


def write_mesh_file(home: Path, stack: Stack, api_key: str = DEV_KEY) -> Path:
    """A mesh.json as ``llmmesh up`` writes it, for ``stack``."""
    assert stack.edge is not None
    home.mkdir(parents=True, exist_ok=True)
    mesh = {
        "edge_url": stack.edge.url,
        "api_key": api_key,
        "global_address": stack.global_plane.address,
        "regions": [{"region": "us-east", "zone": "us", "address": stack.region.address, "engines": []}],
        "tls": {"insecure": True},
    }
    path = home / "mesh.json"
    path.write_text(json.dumps(mesh))
    return path


async def test_the_region_and_key_come_from_mesh_json(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMMESH_HOME", str(tmp_path / "nowhere"))
    with pytest.raises(MeshFileError, match="llmmesh up"):
        read_mesh_file()
    monkeypatch.setenv("LLMMESH_HOME", str(tmp_path / "home"))
    write_mesh_file(tmp_path / "home", stack)
    mesh = read_mesh_file()
    assert mesh.region().address == stack.region.address and mesh.api_key == DEV_KEY
    with pytest.raises(MeshFileError, match="eu-west"):
        mesh.region("eu-west")
    async with ChatClient.from_mesh_file() as chat:
        assert chat.address == stack.region.address
        assert isinstance(await chat.list_conversations(), list)


# ------------------------------------------------------------------ llmmesh chat


@dataclass
class ChatRun:
    """What a ``llmmesh chat`` process left behind."""

    status: int
    stdout: str
    stderr: str


async def run_chat(stdin: str, *flags: str, home: Path) -> ChatRun:
    """Run ``llmmesh chat FLAGS`` with ``stdin`` piped in, to its end."""
    process = await asyncio.create_subprocess_exec(
        str(LLMMESH), "chat", *flags,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "LLMMESH_HOME": str(home)},
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(process.communicate(stdin.encode()), BOUND_S)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return ChatRun(process.returncode, out.decode(), err.decode())


def lines(*prompts: str) -> str:
    return "".join(f"{prompt}\n" for prompt in prompts)


async def test_chat_over_grpc_streams_every_reply(stack: Stack, client: ChatClient, tmp_path: Path) -> None:
    expected = await replies(client, PROMPTS, max_tokens=8)
    flags = (
        "--region-address",
        stack.region.address,
        "--insecure",
        "--api-key",
        DEV_KEY,
        "--max-tokens",
        "8",
    )
    done = await run_chat(lines(*PROMPTS), *flags, home=tmp_path)
    assert done.status == 0, done.stderr
    assert done.stdout == "".join(f"{reply}\n" for reply in expected)
    assert done.stderr.count("-- length · ") == 2 and "region us-east" in done.stderr


async def test_chat_over_http_streams_every_reply(stack: Stack, client: ChatClient, tmp_path: Path) -> None:
    assert stack.edge is not None
    expected = await replies(client, PROMPTS, max_tokens=8)
    flags = ("--transport", "http", "--edge-url", stack.edge.url, "--api-key", DEV_KEY, "--max-tokens", "8")
    done = await run_chat(lines(*PROMPTS), *flags, home=tmp_path)
    assert done.status == 0, done.stderr
    assert done.stdout == "".join(f"{reply}\n" for reply in expected)
    assert done.stderr.count("-- length · ") == 2 and "region us-east" in done.stderr


async def test_chat_keeps_a_conversation_found_through_mesh_json(
    stack: Stack, client: ChatClient, tmp_path: Path
) -> None:
    write_mesh_file(tmp_path, stack)
    stdin = lines(PROMPTS[0], "/reset", PROMPTS[1], "/exit", "never sent")
    done = await run_chat(stdin, "--conversation", "--max-tokens", "4", home=tmp_path)
    assert done.status == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith("conversation conv_us_us-east_")]
    assert len(notes) == 2
    ids = [note.split()[1] for note in notes]
    assert sorted(c.id for c in await client.list_conversations()) == sorted(ids)
    first, second = [[m.content for m in await client.list_messages(id)] for id in ids]
    assert (first[0], second[0]) == PROMPTS
    assert done.stdout == f"{first[1]}\n{second[1]}\n"


async def test_a_failed_turn_prints_one_line_and_the_chat_goes_on(stack: Stack, tmp_path: Path) -> None:
    flags = ("--region-address", stack.region.address, "--insecure", "--api-key", "sk-llmmesh-wrong")
    done = await run_chat(lines(*PROMPTS), *flags, home=tmp_path)
    assert done.status == 1
    assert done.stdout == ""
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 2
    assert all(line.startswith("llmmesh chat: ") and line.endswith("(API_KEY_INVALID)") for line in errors)


async def test_chat_without_an_address_or_mesh_json_cannot_start(tmp_path: Path) -> None:
    done = await run_chat(lines(*PROMPTS), home=tmp_path)
    assert done.status == 2
    assert "llmmesh up" in done.stderr


async def test_ctrl_c_cancels_the_reply_and_the_chat_goes_on(tmp_path: Path) -> None:
    # Slow tokens: even the shortest natural reply outlasts the signal's way.
    async with running_stack(sim_inter_token_s=0.25) as slow:
        await ctrl_c_during_a_reply(slow, tmp_path)


async def ctrl_c_during_a_reply(stack: Stack, tmp_path: Path) -> None:
    flags = ("--region-address", stack.region.address, "--insecure", "--api-key", DEV_KEY)
    process = await asyncio.create_subprocess_exec(
        str(LLMMESH), "chat", *flags,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "LLMMESH_HOME": str(tmp_path)},
    )  # fmt: skip
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write(lines("Tell me everything.").encode())
        await process.stdin.drain()
        # The reply has begun streaming once its first text arrives.
        first = await asyncio.wait_for(process.stdout.read(1), BOUND_S)
        assert first
        process.send_signal(signal.SIGINT)
        process.stdin.write(lines("/exit").encode())
        out, err = await asyncio.wait_for(process.communicate(), BOUND_S)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()
    assert "-- cancelled · " in err.decode()
    reply_tokens = int(err.decode().split(" prompt + ")[1].split(" reply tokens")[0])
    assert reply_tokens > 0  # billed: the region reported the usage of the cancelled turn
    assert (first + out).decode().endswith("\n")


# ------------------------------------------------------------------ mutual TLS


@dataclass
class SecureRegion:
    """Region us-east (with its global plane and pod) serving mTLS, and the certificate directory."""

    address: str
    certs: Path


@pytest_asyncio.fixture
async def secure(tmp_path: Path) -> AsyncIterator[SecureRegion]:
    async with secure_stack(tmp_path) as stack:
        stack.pki.files(CLIENT)  # issued into the mesh's certificate directory
        yield SecureRegion(stack.region.address, stack.pki.ca.directory)


async def test_the_client_presents_its_certificate_to_an_mtls_region(secure: SecureRegion) -> None:
    security = MeshTls(certs_dir=secure.certs).security("client")
    async with ChatClient(secure.address, DEV_KEY, security=security) as chat:
        turn = chat.stream_chat([Message("user", "Hello!")], max_tokens=4)
        async with asyncio.timeout(BOUND_S):
            async for _ in turn:
                pass
        assert turn.finished == Finished("length", "") and turn.usage is not None
    async with ChatClient(secure.address, DEV_KEY, security=PLAINTEXT) as plaintext:
        # No certificate, no handshake: the region is out of reach.
        with pytest.raises(Unavailable):
            await plaintext.list_conversations()


async def test_the_default_is_the_client_certificate_of_llmmesh_home(
    secure: SecureRegion, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMMESH_HOME", str(tmp_path / "bare"))
    with pytest.raises(CertificateSetupError, match="`llmmesh certs issue client`, or pass --insecure"):
        ChatClient(secure.address, DEV_KEY)
    home = tmp_path / "home"
    home.mkdir()
    (home / "certs").symlink_to(secure.certs)
    monkeypatch.setenv("LLMMESH_HOME", str(home))
    async with ChatClient(secure.address, DEV_KEY) as chat:
        assert isinstance(await chat.list_conversations(), list)


async def test_mesh_json_says_how_to_reach_the_regions(
    secure: SecureRegion, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("LLMMESH_HOME", str(home))
    region = {"region": "us-east", "zone": "us", "address": secure.address, "engines": []}
    mesh = {
        "api_key": DEV_KEY,
        "regions": [region],
        "tls": {"insecure": False, "certs_dir": str(secure.certs)},
    }
    (home / "mesh.json").write_text(json.dumps(mesh))
    assert read_mesh_file().tls == MeshTls(certs_dir=secure.certs)
    async with ChatClient.from_mesh_file() as chat:
        assert isinstance(await chat.list_conversations(), list)
    (home / "mesh.json").write_text(json.dumps({**mesh, "tls": "yes"}))
    with pytest.raises(MeshFileError, match="tls must be an object"):
        read_mesh_file()


async def test_flags_win_over_mesh_json_and_the_default_is_mtls(tmp_path: Path) -> None:
    from_file = MeshTls(certs_dir=tmp_path / "mesh")
    assert MeshTls.from_json(None) == MeshTls() and MeshTls().directory is not None
    assert MeshTls.from_json({"insecure": True}) == MeshTls(insecure=True)
    assert MeshTls.from_flags(False, "", from_file) == from_file
    assert MeshTls.from_flags(False, str(tmp_path), from_file) == MeshTls(certs_dir=tmp_path)
    assert MeshTls.from_flags(True, "", from_file) == MeshTls(insecure=True)
    assert MeshTls.from_flags(False, "", MeshTls(insecure=True)).security("client").enabled is False


async def test_llmmesh_chat_over_mtls(secure: SecureRegion, tmp_path: Path) -> None:
    flags = ("--region-address", secure.address, "--api-key", DEV_KEY, "--max-tokens", "4")
    done = await run_chat(lines(PROMPTS[0]), *flags, "--certs-dir", str(secure.certs), home=tmp_path)
    assert done.status == 0, done.stderr
    assert done.stderr.count("-- length · ") == 1 and done.stdout.strip()
    # No certificate where it looks: one line that says how to get one, before any turn.
    bare = await run_chat(lines(PROMPTS[0]), *flags, home=tmp_path / "bare")
    assert (bare.status, bare.stdout) == (2, "")
    [line] = bare.stderr.strip().splitlines()
    assert line.startswith(f"llmmesh chat: no client certificate in {tmp_path / 'bare' / 'certs'}")
    assert "`llmmesh certs issue client`, or pass --insecure" in line and line.endswith("(NO_CERTIFICATE)")
