"""The front proxy's TLS: what Envoy serves to clients on its listeners and
how it checks the planes behind it (part of :mod:`llmmesh.topology.envoy_config`).

Downstream, both listeners serve one certificate for the public names (from
a CA the clients trust, not the mesh CA); the gRPC listener can also demand
a client certificate. Upstream, Envoy calls the regions with mutual TLS as a
``client``-role mesh identity, not an ``edge`` one: it relays outside
callers, and a region accepts failover continuations from edges only, so a
caller behind the proxy can never send one on the proxy's certificate. It
accepts a region only if the certificate is from the mesh CA and names the
zone the cluster serves (``ZONE.region.llmmesh``), so a region of another
zone is refused at the handshake.

The two certificates Envoy presents (the public one and its mesh identity)
reach it through file-based secret discovery: beside each certificate lies
an SDS file (``front-proxy.sds.yaml`` beside ``front-proxy.pem``,
:func:`write_sds_files`) naming it and its key, and Envoy watches the files
it names, so a certificate rotated in place (written to a new file and
renamed over the old, as ``llmmesh certs`` does, key first) is served on
the next connection without a restart. A certificate given inline would be
read only when Envoy starts. The CA bundles are read when it starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmmesh.core.certs import stem_of
from llmmesh.core.identity import PlaneIdentity, Role, role_name
from llmmesh.topology.yaml_text import to_yaml

Doc = dict[str, Any]

DEFAULT_CERTS_DIR = "/etc/llmmesh/certs"
PROXY_IDENTITY = PlaneIdentity(Role.CLIENT, "front-proxy")
"""Who Envoy is to the regions: ``llmmesh certs issue client --name front-proxy``."""
SERVER_STEM = "front-proxy"
"""``front-proxy.pem`` / ``.key``: the certificate for the public names."""
EDGE_SERVER_NAME = role_name(Role.EDGE)
_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."
# Envoy's upstream default stops at TLS 1.2; the planes all speak 1.3.
_VERSIONS = {"tls_minimum_protocol_version": "TLSv1_2", "tls_maximum_protocol_version": "TLSv1_3"}


@dataclass(frozen=True)
class ProxyTls:
    """Where the front proxy's certificates are (paths as Envoy will read them).

    ``server_cert``/``server_key`` are served on both listeners;
    ``mesh_cert``/``mesh_key`` are presented to the regions and
    ``mesh_ca`` checks them. ``client_ca``, when set, makes the gRPC
    listener require a client certificate from it. ``edge_https``: the edge
    instances serve HTTPS, checked against ``edge_ca`` (the mesh CA when
    empty) and ``edge_server_name``; False sends them plain HTTP (an edge
    beside the proxy, on a network trusted with the callers' keys).
    """

    server_cert: str
    server_key: str
    mesh_cert: str
    mesh_key: str
    mesh_ca: str
    client_ca: str = ""
    edge_https: bool = True
    edge_ca: str = ""
    edge_server_name: str = EDGE_SERVER_NAME

    @classmethod
    def in_directory(cls, directory: str | Path = DEFAULT_CERTS_DIR, **options: Any) -> ProxyTls:
        """The layout of a mesh certificate directory: ``front-proxy.pem``
        and ``.key`` (public names), ``client-front-proxy.pem`` and ``.key``
        (mesh identity), ``ca.pem`` (mesh CA)."""
        base = Path(directory)
        mesh = stem_of(PROXY_IDENTITY)
        return cls(
            server_cert=str(base / f"{SERVER_STEM}.pem"),
            server_key=str(base / f"{SERVER_STEM}.key"),
            mesh_cert=str(base / f"{mesh}.pem"),
            mesh_key=str(base / f"{mesh}.key"),
            mesh_ca=str(base / "ca.pem"),
            **options,
        )


def _file(path: str) -> Doc:
    return {"filename": path}


def sds_path(cert: str) -> str:
    """The SDS file of the certificate ``cert``: beside it, ``STEM.sds.yaml``."""
    return str(Path(cert).with_suffix(".sds.yaml"))


def _presented(cert: str) -> Doc:
    """The part of a ``CommonTlsContext`` that presents ``cert``, through its SDS file."""
    source = {"path_config_source": {"path": sds_path(cert)}, "resource_api_version": "V3"}
    return {"tls_certificate_sds_secret_configs": [{"name": Path(cert).stem, "sds_config": source}]}


def sds_documents(tls: ProxyTls) -> dict[str, Doc]:
    """Each SDS file the config names, by path: the secret naming a
    certificate Envoy presents and its key."""
    documents = {}
    for cert, key in ((tls.server_cert, tls.server_key), (tls.mesh_cert, tls.mesh_key)):
        secret = {
            "@type": _TLS + "Secret",
            "name": Path(cert).stem,
            "tls_certificate": {"certificate_chain": _file(cert), "private_key": _file(key)},
        }
        documents[sds_path(cert)] = {"resources": [secret]}
    return documents


def write_sds_files(tls: ProxyTls) -> list[Path]:
    """Write :func:`sds_documents` (each atomically); the paths written."""
    written = []
    for path, document in sds_documents(tls).items():
        target = Path(path)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(to_yaml(document))
        os.replace(tmp, target)
        written.append(target)
    return written


def _socket(kind: str, context: Doc) -> Doc:
    return {"name": "envoy.transport_sockets.tls", "typed_config": {"@type": _TLS + kind, **context}}


def _checked_against(ca: str, name: str) -> Doc:
    return {
        "trusted_ca": _file(ca),
        "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": name}}],
    }


def downstream_socket(tls: ProxyTls, alpn: list[str], *, verify_clients: bool) -> Doc:
    """A listener's TLS: the public certificate, ``alpn`` offered, and a
    client certificate from ``tls.client_ca`` required when ``verify_clients``."""
    common: Doc = {
        "tls_params": _VERSIONS,
        "alpn_protocols": alpn,
        **_presented(tls.server_cert),
    }
    context: Doc = {"common_tls_context": common}
    if verify_clients and tls.client_ca:
        common["validation_context"] = {"trusted_ca": _file(tls.client_ca)}
        context["require_client_certificate"] = True
    return _socket("DownstreamTlsContext", context)


def region_socket(tls: ProxyTls, zone: str) -> Doc:
    """Mutual TLS to a region of ``zone``: the proxy's mesh identity out,
    a region certificate of that zone from the mesh CA in."""
    name = role_name(Role.REGION, zone)
    common: Doc = {
        "tls_params": _VERSIONS,
        "alpn_protocols": ["h2"],
        **_presented(tls.mesh_cert),
        "validation_context": _checked_against(tls.mesh_ca, name),
    }
    return _socket("UpstreamTlsContext", {"sni": name, "common_tls_context": common})


def edge_socket(tls: ProxyTls) -> Doc:
    """HTTPS to the edge instances, their certificate checked by CA and name."""
    common: Doc = {
        "tls_params": _VERSIONS,
        "alpn_protocols": ["http/1.1"],
        "validation_context": _checked_against(tls.edge_ca or tls.mesh_ca, tls.edge_server_name),
    }
    return _socket("UpstreamTlsContext", {"sni": tls.edge_server_name, "common_tls_context": common})
