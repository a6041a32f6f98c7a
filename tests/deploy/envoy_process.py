"""The real Envoy for the front-proxy tests: ``envoy --mode validate`` on a
config, and a running Envoy on a rendered topology with every port free."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
import httpx

from llmmesh.core.grpcserver import open_channel
from llmmesh.topology.envoy_config import FrontProxy, envoy_config
from llmmesh.topology.envoy_tls import write_sds_files
from llmmesh.topology.yaml_text import to_yaml
from llmmesh.v1 import chat_service_pb2, chat_service_pb2_grpc, common_pb2
from tests.stack import DEV_KEY

ENVOY = Path(sys.executable).parent / "envoy"
STARTUP_TIMEOUT_S = 30.0
# Each Envoy of a run gets its own shared-memory id, so parallel runs never meet.
_BASE_IDS = itertools.count(os.getpid() % 10_000 * 100)


def validate(config: Path) -> subprocess.CompletedProcess[str]:
    """``envoy --mode validate`` on ``config`` (it also reads every file the config names)."""
    return subprocess.run(
        [str(ENVOY), "--mode", "validate", "-c", str(config), "--disable-hot-restart", "--log-level", "warn"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@dataclass
class RunningEnvoy:
    """A running Envoy and where its listeners bound."""

    process: subprocess.Popen[bytes]
    admin_url: str
    http_port: int
    grpc_address: str
    log: Path

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    async def stat(self, name: str) -> int:
        """One counter of Envoy's admin ``/stats`` (0 when it has none yet)."""
        async with httpx.AsyncClient(timeout=5) as client:
            text = (await client.get(f"{self.admin_url}/stats", params={"filter": f"^{name}$"})).text
        for line in text.splitlines():
            key, _, value = line.partition(": ")
            if key == name:
                return int(value)
        return 0


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def _text(path: Path) -> str:
    return path.read_text(errors="replace").strip() if path.exists() else ""


async def _wait_live(process: subprocess.Popen[bytes], admin_file: Path, log: Path) -> str:
    """Wait until Envoy's admin interface says LIVE; return its URL."""
    async with asyncio.timeout(STARTUP_TIMEOUT_S), httpx.AsyncClient(timeout=2) as client:
        while True:
            assert process.poll() is None, f"envoy exited:\n{_text(log)}"
            if address := _text(admin_file):
                try:
                    if (await client.get(f"http://{address}/ready")).text.strip() == "LIVE":
                        return f"http://{address}"
                except httpx.TransportError:
                    pass
            await asyncio.sleep(0.05)


@asynccontextmanager
async def running_envoy(proxy: FrontProxy, workdir: Path) -> AsyncIterator[RunningEnvoy]:
    """Run the real Envoy on ``proxy`` rendered with every port free (0); stop it afterwards."""
    proxy = dataclasses.replace(proxy, listen_host="127.0.0.1", http_port=0, grpc_port=0, admin_port=0)
    config, admin_file, log = workdir / "envoy.yaml", workdir / "envoy-admin", workdir / "envoy.log"
    config.write_text(to_yaml(envoy_config(proxy)))
    if proxy.tls is not None:
        write_sds_files(proxy.tls)
    argv = [str(ENVOY), "-c", str(config), "--base-id", str(next(_BASE_IDS)), "--disable-hot-restart"]
    argv += ["--concurrency", "1", "--admin-address-path", str(admin_file), "--log-level", "warn"]
    process = _spawn(argv, log)
    try:
        admin = await _wait_live(process, admin_file, log)
        async with httpx.AsyncClient(timeout=5) as client:
            statuses = (await client.get(f"{admin}/listeners?format=json")).json()["listener_statuses"]
        ports = {s["name"]: s["local_address"]["socket_address"]["port_value"] for s in statuses}
        yield RunningEnvoy(process, admin, ports["http"], f"127.0.0.1:{ports['grpc']}", log)
    finally:
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, 10)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait, 10)


def chat_start(max_tokens: int) -> chat_service_pb2.ChatRequest:
    return chat_service_pb2.ChatRequest(
        start=chat_service_pb2.ChatStart(
            model="auto",
            messages=[common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content="Tell me about Envoy.")],
            sampling=common_pb2.SamplingParams(max_tokens=max_tokens),
        )
    )


async def chat_on(
    channel: grpc.aio.Channel,
    header: str,
    value: str,
    max_tokens: int = 8,
    request: chat_service_pb2.ChatRequest | None = None,
) -> list[chat_service_pb2.ChatResponse]:
    """One ChatService turn on ``channel`` (no routing header when ``header`` is empty)."""
    metadata = (("authorization", f"Bearer {DEV_KEY}"), *([(header, value)] if header else []))
    call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(metadata=metadata, timeout=60)
    await call.write(request or chat_start(max_tokens))
    await call.done_writing()
    return [event async for event in call]


async def chat_through(
    envoy: RunningEnvoy, header: str, value: str, max_tokens: int = 8
) -> list[chat_service_pb2.ChatResponse]:
    """One ChatService turn through a plaintext Envoy's gRPC listener."""
    async with open_channel(envoy.grpc_address) as channel:
        return await chat_on(channel, header, value, max_tokens)
