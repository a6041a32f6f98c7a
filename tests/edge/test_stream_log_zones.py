"""Which stream log the edge uses for a zone (:mod:`edge.streams.zones`):
``redis_urls`` names each zone's Redis, ``redis_url`` serves the zones it
does not name, and a malformed ``redis_urls`` is refused naming the
setting. No Redis is reached: clients connect on first use."""

from __future__ import annotations

import pytest

from llmmesh.edge.settings import EdgeSettings
from llmmesh.edge.streams.log import InProcessStreamLog, StreamLog
from llmmesh.edge.streams.log_redis import RedisStreamLog
from llmmesh.edge.streams.zones import build_zone_logs

EU, US, OTHER = "redis://redis-eu:6379/0", "rediss://redis-us:6380/1", "redis://redis-any:6379/2"


def server_of(log: StreamLog) -> tuple[str, int, int]:
    assert isinstance(log, RedisStreamLog)
    kwargs = log._redis.connection_pool.connection_kwargs
    return kwargs["host"], kwargs["port"], kwargs["db"]


@pytest.mark.asyncio
async def test_each_named_zone_gets_its_own_redis_and_the_rest_the_default() -> None:
    logs = build_zone_logs(EdgeSettings(redis_urls=f"eu={EU}, us={US}", redis_url=OTHER))
    try:
        assert server_of(logs.of("eu")) == ("redis-eu", 6379, 0)
        assert server_of(logs.of("us")) == ("redis-us", 6380, 1)
        assert server_of(logs.of("apac")) == ("redis-any", 6379, 2)
        assert logs.shared()
        assert [zones for zones, _ in logs.named()] == ["eu", "us", "*"]
    finally:
        await logs.close()


@pytest.mark.asyncio
async def test_zones_naming_one_url_share_a_client_and_without_any_the_log_is_in_process() -> None:
    logs = build_zone_logs(EdgeSettings(redis_urls=f"eu={EU},us={EU}"))
    try:
        assert logs.of("eu") is logs.of("us")
        # A zone no URL names keeps its streams in this process, never in another zone's Redis.
        assert isinstance(logs.of("apac"), InProcessStreamLog)
        assert [zones for zones, _ in logs.named()] == ["eu,us", "*"]
    finally:
        await logs.close()
    # A zone named without a URL keeps its streams in-process too, not in the default Redis.
    named_none = build_zone_logs(EdgeSettings(redis_urls="eu=", redis_url=OTHER))
    try:
        assert isinstance(named_none.of("eu"), InProcessStreamLog)
        assert isinstance(named_none.of("us"), RedisStreamLog)
    finally:
        await named_none.close()
    alone = build_zone_logs(EdgeSettings())
    assert not alone.shared() and alone.of("eu") is alone.of("us")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("eu", "redis_urls must be 'zone=redis://…' items"),
        ("EU=redis://r/0", "redis_urls must be 'zone=redis://…' items"),
        ("eu=r:6379", "redis_urls must be 'zone=redis://…' items"),
        ("eu=http://r/0", "redis_urls: zone eu's URL must be redis://, rediss:// or unix://"),
        ("eu=redis://a/0,eu=redis://b/0", "redis_urls names zone eu twice"),
    ],
)
def test_a_malformed_redis_urls_is_refused_naming_the_setting(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EdgeSettings(redis_urls=value)


def test_a_password_in_redis_urls_is_never_shown() -> None:
    with pytest.raises(ValueError, match="zone eu's URL") as info:
        EdgeSettings(redis_urls="eu=http://user:hunter2@r/0")
    assert "hunter2" not in str(info.value)
