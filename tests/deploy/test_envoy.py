"""The Envoy front proxy's configs: the example is the rendered default
topology, TLS is on for every hop unless a topology asks for plaintext, and
the configs pass ``envoy --mode validate`` with the files they name; and a
plaintext Envoy (development) streams a turn longer than its first-byte
guard. tests/deploy/test_envoy_tls.py runs the TLS one."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from llmmesh.topology.envoy_config import (
    HEADER,
    REGION_HEADER,
    FrontProxy,
    RegionUpstream,
    Upstream,
    embedded_front_proxy,
    envoy_config,
    main,
)
from llmmesh.topology.envoy_tls import DEFAULT_CERTS_DIR, ProxyTls, sds_documents, write_sds_files
from llmmesh.topology.yaml_text import to_yaml
from llmmesh.v1 import common_pb2
from tests.deploy.envoy_process import chat_through, running_envoy, validate
from tests.deploy.tls_mesh import issue_certificates
from tests.stack import running_stack

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "envoy" / "front-proxy.yaml"
TLS_SOCKET = "envoy.transport_sockets.tls"


def _listeners(config: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item for item in config["static_resources"]["listeners"]}


def _clusters(config: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item for item in config["static_resources"]["clusters"]}


def _tls_context(socket: dict[str, Any]) -> dict[str, Any]:
    assert socket["name"] == TLS_SOCKET
    return socket["typed_config"]  # type: ignore[no-any-return]


def _presented(common: dict[str, Any]) -> str:
    """The certificate a TLS context presents, through the SDS file it names."""
    assert "tls_certificates" not in common, "an inline certificate would never reload"
    (secret,) = common["tls_certificate_sds_secret_configs"]
    path = secret["sds_config"]["path_config_source"]["path"]
    (resource,) = sds_documents(ProxyTls.in_directory(Path(path).parent))[path]["resources"]
    assert resource["name"] == secret["name"]
    chain: str = resource["tls_certificate"]["certificate_chain"]["filename"]
    assert resource["tls_certificate"]["private_key"]["filename"] == chain.removesuffix(".pem") + ".key"
    return chain


# ---------------------------------------------------------------- the configs


def test_example_config_is_the_rendered_embedded_topology() -> None:
    assert EXAMPLE.read_text() == HEADER + to_yaml(envoy_config(embedded_front_proxy())), (
        f"{EXAMPLE} is stale: run python -m llmmesh.topology.envoy_config > deploy/envoy/front-proxy.yaml"
    )


def test_example_config_validates_with_the_certificates_it_names(tmp_path: Path) -> None:
    """Envoy reads every certificate a config names while validating it, so
    the example is checked with its certificate directory moved to one
    that holds the documented layout."""
    certs = issue_certificates(tmp_path).mesh.ca.directory
    write_sds_files(ProxyTls.in_directory(certs))
    config = tmp_path / "front-proxy.yaml"
    config.write_text(EXAMPLE.read_text().replace(DEFAULT_CERTS_DIR + "/", f"{certs}/"))
    result = validate(config)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rendered_config_with_dns_names_validates(tmp_path: Path) -> None:
    certs = issue_certificates(tmp_path)
    proxy = FrontProxy(
        edges=(
            Upstream.parse("edge-0.llmmesh.internal:8080"),
            Upstream.parse("edge-1.llmmesh.internal:8080"),
        ),
        regions=(
            RegionUpstream("eu-west", "eu", Upstream.parse("chat.eu-west.llmmesh.internal:50051")),
            RegionUpstream("eu-central", "eu", Upstream.parse("chat.eu-central.llmmesh.internal:50051")),
            RegionUpstream("us-east", "us", Upstream.parse("10.0.0.7:50051")),
        ),
        tls=certs.proxy_tls(),
        http_port=8443,
        grpc_port=8444,
    )
    write_sds_files(certs.proxy_tls())
    for variant in (proxy, dataclasses.replace(proxy, tls=None)):
        config = tmp_path / "envoy.yaml"
        config.write_text(to_yaml(envoy_config(variant)))
        result = validate(config)
        assert result.returncode == 0, result.stdout + result.stderr
    clusters = _clusters(envoy_config(proxy))
    assert clusters["region-eu-west"]["type"] == "STRICT_DNS"
    assert clusters["region-us-east"]["type"] == "STATIC"


def test_every_hop_of_the_example_is_tls() -> None:
    config = envoy_config(embedded_front_proxy())
    listeners = _listeners(config)
    for name, alpn in (("http", ["h2", "http/1.1"]), ("grpc", ["h2"])):
        context = _tls_context(listeners[name]["filter_chains"][0]["transport_socket"])
        common = context["common_tls_context"]
        assert common["alpn_protocols"] == alpn
        assert _presented(common) == f"{DEFAULT_CERTS_DIR}/front-proxy.pem"
        # Callers authenticate with API keys unless a client CA is configured.
        assert "require_client_certificate" not in context
    for name, cluster in _clusters(config).items():
        context = _tls_context(cluster["transport_socket"])
        validation = context["common_tls_context"]["validation_context"]
        assert validation["trusted_ca"] == {"filename": f"{DEFAULT_CERTS_DIR}/ca.pem"}
        if name == "edge":
            expected = "edge.llmmesh"
            assert "tls_certificate_sds_secret_configs" not in context["common_tls_context"]
        else:
            zone = "eu" if "eu" in name else "us"
            expected = f"{zone}.region.llmmesh"
            assert _presented(context["common_tls_context"]) == f"{DEFAULT_CERTS_DIR}/client-front-proxy.pem"
        assert context["sni"] == expected, name
        assert validation["match_typed_subject_alt_names"] == [
            {"san_type": "DNS", "matcher": {"exact": expected}}
        ], name


def test_a_client_ca_makes_the_grpc_listener_ask_for_certificates() -> None:
    tls = ProxyTls.in_directory("/certs", client_ca="/certs/customers.pem")
    listeners = _listeners(envoy_config(embedded_front_proxy(tls)))
    grpc_tls = _tls_context(listeners["grpc"]["filter_chains"][0]["transport_socket"])
    assert grpc_tls["require_client_certificate"] is True
    assert grpc_tls["common_tls_context"]["validation_context"] == {
        "trusted_ca": {"filename": "/certs/customers.pem"}
    }
    http_tls = _tls_context(listeners["http"]["filter_chains"][0]["transport_socket"])
    assert "require_client_certificate" not in http_tls


def test_plaintext_only_when_asked() -> None:
    plain = envoy_config(embedded_front_proxy(None))
    assert "transport_socket" not in str(plain)
    edges_plain = envoy_config(embedded_front_proxy(ProxyTls.in_directory(edge_https=False)))
    assert "transport_socket" not in _clusters(edges_plain)["edge"]
    assert "transport_socket" in _clusters(edges_plain)["region-us-east"]


def test_the_command_line_renders_tls_with_absolute_paths(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    main([])
    assert capsys.readouterr().out == EXAMPLE.read_text()
    main(["--certs-dir", "certs", "--client-ca", "customers.pem", "--edge-http"])
    out = capsys.readouterr().out
    assert f"path: {tmp_path}/certs/client-front-proxy.sds.yaml" in out
    assert f"filename: {tmp_path}/customers.pem" in out
    assert "require_client_certificate: true" in out
    assert "edge.llmmesh" not in out
    # --write-sds also writes the SDS files the config names, beside the certificates.
    (tmp_path / "certs").mkdir()
    main(["--certs-dir", "certs", "--write-sds"])
    assert capsys.readouterr().out == EXAMPLE.read_text().replace("/etc/llmmesh/certs", f"{tmp_path}/certs")
    written = sorted(path.name for path in (tmp_path / "certs").iterdir())
    assert written == ["client-front-proxy.sds.yaml", "front-proxy.sds.yaml"]
    assert (
        f"filename: {tmp_path}/certs/front-proxy.key"
        in (tmp_path / "certs" / "front-proxy.sds.yaml").read_text()
    )
    main(["--plaintext"])
    assert "transport_socket" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--plaintext", "--client-ca", "customers.pem"])
    with pytest.raises(SystemExit):
        main(["--plaintext", "--write-sds"])


def test_region_clusters_fail_over_only_inside_their_zone() -> None:
    clusters = {c["name"]: c for c in envoy_config(embedded_front_proxy())["static_resources"]["clusters"]}
    localities = [
        (e["priority"], e["locality"]["region"])
        for e in clusters["region-eu-west"]["load_assignment"]["endpoints"]
    ]
    assert localities == [(0, "eu-west"), (1, "eu-central")]
    zone_us = clusters["zone-us"]["load_assignment"]["endpoints"]
    assert {(e["priority"], e["locality"]["region"]) for e in zone_us} == {(0, "us-east"), (0, "us-west")}
    for name, cluster in clusters.items():
        assert cluster["health_checks"] and cluster["outlier_detection"], name
        protocol = cluster["typed_extension_protocol_options"][
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        ]
        if name != "edge":
            assert "http2_protocol_options" in protocol["explicit_http_config"]
            assert cluster["health_checks"][0]["grpc_health_check"] == {
                "service_name": "llmmesh.v1.ChatService"
            }


def test_routes_are_streaming_safe_and_never_retry_answers() -> None:
    listeners = envoy_config(embedded_front_proxy())["static_resources"]["listeners"]
    for listener in listeners:
        manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
        assert manager["stream_idle_timeout"] == "300s"
        for route in manager["route_config"]["virtual_hosts"][0]["routes"]:
            action = route["route"]
            assert action["timeout"] == "0s"
            retry = action["retry_policy"]
            assert retry["per_try_timeout"] == "30s"
            assert set(retry["retry_on"].split(",")) <= {
                "connect-failure",
                "refused-stream",
                "reset",
                "unavailable",
            }


# ---------------------------------------------------------------- a real Envoy, plaintext


@pytest.mark.e2e
@pytest.mark.asyncio
async def test_a_stream_outlives_the_first_byte_guard(tmp_path: Path) -> None:
    """``per_try_timeout`` bounds the wait for the first byte only: a
    generation that streams for longer than it still ends normally."""
    async with running_stack(with_edge=True, sim_inter_token_s=0.05) as stack:
        assert stack.edge is not None
        proxy = FrontProxy(
            edges=(Upstream.parse(stack.edge.url.removeprefix("http://")),),
            regions=(RegionUpstream("us-east", "us", Upstream.parse(stack.region.address)),),
            tls=None,
            first_byte_timeout_s=1.5,
        )
        async with running_envoy(proxy, tmp_path) as envoy:
            events = await chat_through(envoy, REGION_HEADER, "us-east", max_tokens=48)
    assert events[-1].finished.reason == common_pb2.FINISH_REASON_LENGTH
    assert sum(1 for e in events if e.WhichOneof("event") == "delta") > 1
