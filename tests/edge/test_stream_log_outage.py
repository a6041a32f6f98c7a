"""The edge survives its stream log's Redis: a private ``redis-server``
killed in the middle of a stream leaves the stream running to ``[DONE]``
(no longer resumable, counted), a resume meanwhile is a clear 503, a stream
begun without Redis says it is not resumable, and once Redis is back new
streams are logged and resumable again."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmmesh.cli.embedded_redis import free_port, redis_probe
from tests.edge.test_streams import AUTH, RESUMABLE, UNFILTERED, body, edge_on, read_stream
from tests.stack import running_stack

pytestmark = pytest.mark.asyncio


class PrivateRedis:
    """A ``redis-server`` of the test's own on a free loopback port."""

    def __init__(self, data_dir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        self.port = free_port("127.0.0.1")
        self._argv = [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", ""]
        self._argv += ["--appendonly", "no", "--dir", str(data_dir)]
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _spawn(self) -> None:
        self._process = subprocess.Popen(self._argv, stdout=subprocess.DEVNULL)

    async def start(self) -> None:
        self._spawn()
        probe = redis_probe("127.0.0.1", self.port)
        async with asyncio.timeout(10):
            while probe() is None:
                await asyncio.sleep(0.05)

    def kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    redis = PrivateRedis(tmp_path)
    yield redis
    redis.kill()


def unlogged(metrics: str, reason: str) -> float:
    line = f'llmmesh_edge_streams_unlogged_total{{reason="{reason}"}} '
    return float(next(m for m in metrics.splitlines() if m.startswith(line)).split()[-1])


async def test_streams_go_on_through_a_redis_outage_and_are_resumable_again_after_it(
    private_redis: PrivateRedis,
) -> None:
    await private_redis.start()
    async with (
        running_stack(region_overrides=UNFILTERED, sim_inter_token_s=0.03) as stack,
        edge_on(stack, redis_url=private_redis.url, stream_log_timeout_ms=300) as (_, client),
    ):
        request = body(max_tokens=24)
        # The counters are the process's: other tests in it may have counted streams.
        before = (await client.get("/metrics")).text
        write_failed, unreachable = unlogged(before, "log_write_failed"), unlogged(before, "log_unreachable")
        async with client.stream(
            "POST", "/v1/chat/completions", json=request, headers={**AUTH, **RESUMABLE}
        ) as resp:
            assert resp.status_code == 200 and "x-llmmesh-resumable" not in resp.headers
            stream_id = resp.headers["x-request-id"]
            lines: list[str] = []
            async for line in resp.aiter_lines():
                lines.append(line)
                if line.startswith("data: ") and sum(text.startswith("data: ") for text in lines) == 3:
                    private_redis.kill()
        data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
        ids = [int(line.removeprefix("id: ")) for line in lines if line.startswith("id: ")]
        # Every event once, in order, to the end: the outage cost the stream nothing.
        assert data[-1] == "[DONE]" and not any('"error"' in text for text in data)
        assert ids == list(range(len(ids))) and len(ids) >= 24
        metrics = (await client.get("/metrics")).text
        assert unlogged(metrics, "log_write_failed") == write_failed + 1

        # A resume needs the log: a clear 503 while it is away.
        resumed = await client.get(f"/v1/streams/{stream_id}", headers=AUTH)
        assert resumed.status_code == 503
        error = resumed.json()["error"]
        assert error["code"] == "stream_log_unavailable" and "resumption" in error["message"]

        # A stream begun now runs unlogged, and says so; the edge stays ready.
        resp, events = await read_stream(
            client, "POST", "/v1/chat/completions", json=request, headers=RESUMABLE
        )
        assert resp.status_code == 200 and events[-1].data == "[DONE]"
        assert resp.headers["x-llmmesh-resumable"] == "false"
        assert resp.headers["x-llmmesh-resumable-reason"] == "stream_log_unavailable"
        assert unlogged((await client.get("/metrics")).text, "log_unreachable") == unreachable + 1
        ready = await client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["dependencies"]["redis"]["up"] is False

        # Redis back: new streams are logged, and resumable, again.
        await private_redis.start()
        resp, events = await read_stream(client, "POST", "/v1/chat/completions", json=request)
        assert resp.status_code == 200 and "x-llmmesh-resumable" not in resp.headers
        _, rest = await read_stream(
            client, "GET", f"/v1/streams/{resp.headers['x-request-id']}", params={"starting_after": "0"}
        )
        assert [e.data for e in rest] == [e.data for e in events[1:]]
        assert unlogged((await client.get("/metrics")).text, "log_unreachable") == unreachable + 1
