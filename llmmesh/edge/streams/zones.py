"""Each zone's stream log (:class:`ZoneStreamLogs`): a stream holds its
tenant's reply text, so it is written to, read from and cancelled through
the log of the tenant's zone only, in that zone's Redis
(``redis_urls``; ``redis_url`` for zones not named there; neither: this
process's memory). The edge learns a request's zone by authenticating its
key, and only the key that started a stream may resume or cancel it, so a
resume or cancel asks its caller's zone and no other: no zone's Redis is
ever asked about another zone's streams.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from llmmesh.edge.settings import EdgeSettings
from llmmesh.edge.streams.log import CancelListener, InProcessStreamLog, StreamLog


class ZoneStreamLogs:
    """The stream log of each zone; zones not named share ``default``."""

    def __init__(self, default: StreamLog, by_zone: Mapping[str, StreamLog] | None = None) -> None:
        self._default = default
        self._by_zone = dict(by_zone or {})

    def of(self, zone: str) -> StreamLog:
        """The log a stream of a tenant of ``zone`` lives in."""
        return self._by_zone.get(zone, self._default)

    def named(self) -> Iterator[tuple[str, StreamLog]]:
        """Each distinct log, after the zones it serves ("*" for the zones not named)."""
        zones: dict[int, list[str]] = {}
        logs: dict[int, StreamLog] = {}
        for zone, log in [*self._by_zone.items(), ("*", self._default)]:
            zones.setdefault(id(log), []).append(zone)
            logs[id(log)] = log
        for key, log in logs.items():
            yield ",".join(zones[key]), log

    def shared(self) -> bool:
        """Whether some zone's log is outside this process (in Redis)."""
        return any(not isinstance(log, InProcessStreamLog) for _, log in self.named())

    async def start(self, on_cancel: CancelListener) -> None:
        for _, log in self.named():
            await log.start(on_cancel)

    async def close(self) -> None:
        for _, log in self.named():
            await log.close()


def build_zone_logs(settings: EdgeSettings) -> ZoneStreamLogs:
    """A Redis log per Redis the settings name (zones naming the same URL
    share one client), and the in-process log where none is named."""
    grace_s = settings.detached_timeout_ms / 1000
    by_url: dict[str, StreamLog] = {}

    def log_at(url: str) -> StreamLog:
        if url not in by_url:
            if url:
                from llmmesh.edge.streams.log_redis import RedisStreamLog, open_redis

                by_url[url] = RedisStreamLog(
                    open_redis(url),
                    max_events=settings.stream_log_max_events,
                    retention_s=settings.stream_retention_s,
                    reader_grace_s=grace_s,
                )
            else:
                by_url[url] = InProcessStreamLog(
                    max_events=settings.stream_log_max_events,
                    max_streams=settings.stream_log_max_streams,
                    retention_s=settings.stream_retention_s,
                    reader_grace_s=grace_s,
                )
        return by_url[url]

    by_zone = {zone: log_at(url) for zone, url in settings.zone_redis_urls().items()}
    return ZoneStreamLogs(log_at(settings.redis_url), by_zone)
