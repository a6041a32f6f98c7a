"""End to end through ``llmmesh up``: real processes, real gRPC between the
planes, the official ``openai`` SDK and ``curl -N`` at the edge."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.conftest import RunningMesh, child_pids, pid_alive, start_up, stop_up

pytestmark = pytest.mark.e2e

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello, mesh!"}]


_opened: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    # An SDK client left open leaks its pooled sockets into interpreter exit.
    yield
    while _opened:
        _opened.pop().close()


def client(mesh: RunningMesh, key: str | None = None) -> openai.OpenAI:
    sdk = openai.OpenAI(
        base_url=mesh.edge_url + "/v1", api_key=key or mesh.api_key, max_retries=0, timeout=30
    )
    _opened.append(sdk)
    return sdk


def test_mesh_json_names_every_plane(mesh: RunningMesh) -> None:
    info = mesh.info
    assert info["api_key"] == "sk-llmmesh-e2e"
    assert str(info["edge_url"]).startswith("http://127.0.0.1:")
    assert str(info["global_address"]).startswith("127.0.0.1:")
    regions = info["regions"]
    # The single-region readers (llmmesh chat) take the first: the dev zone's first region.
    assert isinstance(regions, list) and (regions[0]["region"], regions[0]["zone"]) == ("us-east", "us")
    assert [r["region"] for r in regions] == ["us-east", "us-west", "eu-west", "eu-central"]
    assert all(r["address"] and len(r["engines"]) == 1 and r["engines"][0]["address"] for r in regions)


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_the_default_mesh_runs_a_redis_of_its_own_per_zone(mesh: RunningMesh) -> None:
    # Rate limits count per key across the regions of a zone only through the zone's Redis.
    urls = mesh.info["redis_urls"]
    assert isinstance(urls, dict) and sorted(urls) == ["eu", "us"] and len(set(urls.values())) == 2
    assert all(str(url).startswith("redis://127.0.0.1:") for url in urls.values())
    # redis_url and pids.redis: the dev zone's, for readers of one Redis.
    assert mesh.info["redis_url"] == urls["us"] and mesh.pids["redis"] == mesh.pids["redis-us"]
    assert {mesh.pids["redis-us"], mesh.pids["redis-eu"]} <= set(child_pids(mesh.process.pid))
    assert "llmmesh up: warning" not in mesh.log()


def test_healthz_covers_the_whole_path(mesh: RunningMesh) -> None:
    resp = httpx.get(mesh.edge_url + "/healthz", timeout=10)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["global_plane"] is True
    assert set(body["regions"]) == {"us-east", "us-west", "eu-west", "eu-central"}
    assert all(r["healthy_engine_pods"] == 1 and r["serving"] for r in body["regions"].values())


def test_openai_sdk_streams_a_reply(mesh: RunningMesh) -> None:
    stream = client(mesh).chat.completions.create(
        model="auto", messages=HELLO, stream=True, stream_options={"include_usage": True}, max_tokens=24
    )
    chunks = list(stream)
    ids = {c.id for c in chunks}
    assert len(ids) == 1 and next(iter(ids)).startswith("chatcmpl-")
    assert len({c.created for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["stop"], ["length"])
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    assert usage.completion_tokens > 0 and usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_openai_sdk_non_streaming_has_usage(mesh: RunningMesh) -> None:
    raw = client(mesh).chat.completions.with_raw_response.create(model="auto", messages=HELLO, max_tokens=8)
    assert raw.headers["x-llmmesh-region"] in ("us-east", "us-west")
    completion = raw.parse()
    assert raw.headers["x-request-id"] == completion.id
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content
    assert completion.usage is not None and 0 < completion.usage.completion_tokens <= 8
    assert completion.choices[0].finish_reason in ("stop", "length")


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_streams_chunks_and_done(mesh: RunningMesh) -> None:
    body = json.dumps({"model": "auto", "stream": True, "messages": HELLO, "max_tokens": 12})
    result = subprocess.run(
        ["curl", "-sS", "-N", mesh.edge_url + "/v1/chat/completions",
         "-H", f"authorization: Bearer {mesh.api_key}", "-H", "content-type: application/json", "-d", body],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    events = [e for e in result.stdout.split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e.split("data: ", 1)[1]) for e in events[:-1]]
    assert all(p["object"] == "chat.completion.chunk" for p in payloads)
    # OpenAI's framing: data lines only, no event ids unless a client asks for them.
    assert all(e.startswith("data: ") for e in events[:-1])
    assert payloads[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_models_lists_the_default_model(mesh: RunningMesh) -> None:
    models = client(mesh).models.list()
    names = [m.id for m in models.data]
    assert "llmmesh-tiny" in names


@pytest.mark.parametrize(
    ("payload", "status", "param"),
    [
        (b"{not json", 400, None),
        (b'{"model": "auto"}', 400, "messages"),
        (b'{"model": "auto", "messages": "hi"}', 400, "messages"),
        (b'{"model": 7, "messages": [{"role": "user", "content": "hi"}]}', 400, "model"),
        (b'{"model": "auto", "messages": [{"role": "wizard", "content": "hi"}]}', 400, "messages[0].role"),
        (
            b'{"model": "auto", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}',
            400,
            "max_tokens",
        ),
        (
            b'{"model": "auto", "messages": [{"role": "user", "content": "hi"}], "temperature": -1}',
            400,
            "temperature",
        ),
        (b'{"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}', 404, None),
        (b"[1, 2]", 400, None),
        (
            b'{"model": "auto", "messages": [{"role": "user", "content": "\\ud800"}]}',
            400,
            "messages[0].content",
        ),
    ],
)
def test_bad_input_gets_an_openai_error(
    mesh: RunningMesh, payload: bytes, status: int, param: str | None
) -> None:
    resp = httpx.post(
        mesh.edge_url + "/v1/chat/completions",
        content=payload,
        headers={"authorization": f"Bearer {mesh.api_key}", "content-type": "application/json"},
        timeout=30,
    )
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param


def test_missing_and_wrong_keys_get_401(mesh: RunningMesh) -> None:
    body = {"model": "auto", "messages": HELLO}
    missing = httpx.post(mesh.edge_url + "/v1/chat/completions", json=body, timeout=30)
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "missing_api_key"
    with pytest.raises(openai.AuthenticationError) as info:
        client(mesh, key="sk-wrong").chat.completions.create(model="auto", messages=HELLO)
    assert info.value.status_code == 401
    assert info.value.code == "invalid_api_key"


def test_the_operator_page_opens_with_the_key_made_for_the_mesh(mesh: RunningMesh) -> None:
    ops_key = mesh.info["ops_key"]
    assert isinstance(ops_key, str) and ops_key.startswith("ops-") and len(ops_key) > 20
    assert f"operator key {ops_key}" in mesh.log()
    regions = httpx.get(
        mesh.edge_url + "/ops/api/regions", headers={"Authorization": f"Bearer {ops_key}"}, timeout=30
    )
    assert regions.status_code == 200, regions.text
    # A tenant's API key opens nothing there.
    tenant = httpx.get(
        mesh.edge_url + "/ops/api/regions", headers={"Authorization": f"Bearer {mesh.api_key}"}, timeout=30
    )
    assert tenant.status_code == 401, tenant.text


def test_unknown_model_is_not_found_for_the_sdk(mesh: RunningMesh) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client(mesh).chat.completions.create(model="no-such-model", messages=HELLO)
    assert info.value.code == "model_not_found"


def test_unknown_route_is_an_openai_404(mesh: RunningMesh) -> None:
    resp = httpx.get(mesh.edge_url + "/v1/nothing-here", timeout=10)
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "not_found"


def test_sigterm_stops_every_process(tmp_path_factory: pytest.TempPathFactory) -> None:
    home = tmp_path_factory.mktemp("llmmesh-stop")
    running = start_up(home, "--edge-port", "0", "--dev-key", "sk-stop")
    children = child_pids(running.process.pid)
    # The global plane, four engine pods, four regions, the edge and a Redis per zone where installed.
    assert len(children) == 10 + 2 * (shutil.which("redis-server") is not None), children
    assert set(children) == set(running.pids.values())
    status, out = stop_up(running)
    assert status == 0, out
    assert not [pid for pid in children if pid_alive(pid)]
    assert not (home / "mesh.json").exists()


def test_redis_none_runs_without_redis_and_warns(tmp_path_factory: pytest.TempPathFactory) -> None:
    home = tmp_path_factory.mktemp("llmmesh-no-redis")
    config = home / "mesh.toml"
    config.write_text("[mesh]\nedge_port = 0\n[zones.us.regions.us-east]\n")
    running = start_up(home, "--config", str(config), "--dev-key", "sk-no-redis", "--redis", "none")
    try:
        assert "redis_url" not in running.info and "redis" not in running.pids
        assert len(child_pids(running.process.pid)) == 4  # global, pod, region, edge
        log = running.log()
        assert "warning: --redis none: rate limits (RPM, TPM) are counted by each region" in log
        assert "redis          none: rate limits count per region" in log
    finally:
        status, out = stop_up(running)
    assert status == 0, out
