"""The mesh's /metrics endpoint: the text format whatever the scraper asks
for, so vLLM's colon names reach Prometheus as vLLM writes them."""

from __future__ import annotations

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge

from llmmesh.core.metrics_http import MetricsEndpoint

# What a Prometheus 2.x server sends when it scrapes.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def test_colon_names_survive_a_prometheus_scrape() -> None:
    registry = CollectorRegistry()
    Gauge("vllm:num_requests_waiting", "waiting", ["model_name"], registry=registry).labels("m").set(3)
    Counter("llmmesh_test_turns", "turns", registry=registry).inc(2)
    endpoint = MetricsEndpoint(registry, "127.0.0.1", 0)
    try:
        response = httpx.get(endpoint.url, headers={"accept": PROMETHEUS_ACCEPT}, timeout=5)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        lines = response.text.splitlines()
        assert 'vllm:num_requests_waiting{model_name="m"} 3.0' in lines
        assert "llmmesh_test_turns_total 2.0" in lines
        assert not any(line.startswith("vllm_") for line in lines)
        missing = httpx.get(endpoint.url.replace("/metrics", "/other"), timeout=5)
        assert missing.status_code == 404
        assert httpx.post(endpoint.url, timeout=5).status_code == 405
    finally:
        endpoint.stop()
