"""How the benchmarks' planes talk: every plane a benchmark starts asks for
plaintext explicitly (the planes' default is mTLS, which a plane without
certificates refuses to start on) or gets the certificates the benchmark
issued; checked through the real command-line parser."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import pytest

from llmmesh.bench.engine import pod_command
from llmmesh.bench.mesh_tls import issue_certs, plane_tls_flags, pod_client_security, pod_server_name
from llmmesh.bench.overhead_plan import OverheadBenchPlan
from llmmesh.bench.overhead_systems import (
    POD_ID,
    edge_command,
    issue_mesh_certs,
    region_command,
    sim_engine_command,
)
from llmmesh.bench.routing_systems import REGION, ZONE, Pod, SimPodSpec, global_command, sim_pod_command
from llmmesh.bench.routing_systems import region_command as routing_region_command
from llmmesh.cli.main import build_parser
from llmmesh.core.certs import CertFiles, identity_of_pem
from llmmesh.core.identity import PlaneIdentity, Role
from llmmesh.core.mtls import MeshSecurity
from llmmesh.engine.settings import EngineSettings
from llmmesh.engine.vllm_engine.config import VllmEngineConfig

READY = Path("/tmp/ready.json")


def _parsed(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` (``python -m llmmesh PLANE ...``) as ``llmmesh`` parses it."""
    assert list(argv[1:3]) == ["-m", "llmmesh"]
    return build_parser().parse_args(list(argv[3:]))


def _plaintext(argv: Sequence[str]) -> bool:
    args = _parsed(argv)
    return args.insecure is True and not args.tls_cert


def test_the_routing_and_engine_benchmarks_planes_ask_for_plaintext() -> None:
    spec = SimPodSpec(kv_blocks=64, block_size=16, max_num_seqs=8, context_window=4096)
    pods = [Pod("p", "127.0.0.1:1", "")]
    config = VllmEngineConfig.from_settings(EngineSettings(), Path("/models/tiny"))
    commands = {
        "sim pod": sim_pod_command(spec, "us-east-pod-0", READY),
        "region": routing_region_command("precise", "127.0.0.1:2", pods, READY),
        "global": global_command(Path("/tmp/global.db"), READY),
        "vllm pod": pod_command(config, EngineSettings(backend="vllm", pod_id="p"), READY),
    }
    assert {name: _plaintext(argv) for name, argv in commands.items()} == dict.fromkeys(commands, True)


def test_the_overhead_meshes_planes_are_plaintext_or_hold_their_own_certificates(tmp_path: Path) -> None:
    plan = OverheadBenchPlan()

    def commands(certs: Path | None) -> dict[str, list[str]]:
        return {
            "global": global_command(tmp_path / "global.db", READY, certs),
            f"engine-{POD_ID}": sim_engine_command(plan, READY, certs),
            f"region-{REGION}": region_command(False, "127.0.0.1:1", "127.0.0.1:2", tmp_path, READY, certs),
            "edge": edge_command("127.0.0.1:1", READY, certs),
        }

    assert all(_plaintext(argv) for argv in commands(None).values())
    certs = issue_mesh_certs(tmp_path / "certs")
    for stem, argv in commands(certs).items():
        args = _parsed(argv)
        assert args.insecure is None, stem
        assert (args.tls_cert, args.tls_key, args.tls_ca) == (
            str(certs / f"{stem}.pem"),
            str(certs / f"{stem}.key"),
            str(certs / "ca.pem"),
        )
        # What the plane loads: its key and a certificate naming its role.
        files = CertFiles(Path(args.tls_cert), Path(args.tls_key), Path(args.tls_ca))
        identity = MeshSecurity.mtls(files).identity
        assert identity is not None and identity.role == Role(stem.split("-")[0]), stem


def test_issued_certificates_name_each_plane_and_the_direct_client(tmp_path: Path) -> None:
    certs = issue_certs(tmp_path / "certs", "us", "us-east", ["us-east-pod-0", "us-east-pod-1"])
    leaves = [path for path in certs.glob("*.pem") if path.name not in ("ca.pem", "ca-cert.pem")]
    named = {path.stem: identity_of_pem(path.read_bytes()) for path in leaves}
    assert named == {
        "global": PlaneIdentity(Role.GLOBAL, "global"),
        "edge": PlaneIdentity(Role.EDGE, "edge"),
        "admin": PlaneIdentity(Role.ADMIN, "admin"),
        "region-us-east": PlaneIdentity(Role.REGION, "us-east", "us", "us-east"),
        "engine-us-east-pod-0": PlaneIdentity(Role.ENGINE, "us-east-pod-0", "us", "us-east"),
        "engine-us-east-pod-1": PlaneIdentity(Role.ENGINE, "us-east-pod-1", "us", "us-east"),
    }
    # Issuing again keeps what is there (one CA per benchmark run).
    ca = (certs / "ca.pem").read_bytes()
    assert issue_certs(certs, "us", "us-east", ["us-east-pod-0"]) == certs
    assert (certs / "ca.pem").read_bytes() == ca
    client = pod_client_security(certs, "us-east")
    assert client.enabled and client.identity == PlaneIdentity(Role.REGION, "us-east", "us", "us-east")
    assert not pod_client_security(None, "us-east").enabled
    assert pod_server_name(ZONE, REGION) == "us-east.us.engine.llmmesh"


@pytest.mark.parametrize("stem", ["global", "edge"])
def test_plane_flags(stem: str, tmp_path: Path) -> None:
    assert plane_tls_flags(None, stem) == ["--insecure"]
    assert plane_tls_flags(tmp_path, stem) == [
        "--tls-cert",
        str(tmp_path / f"{stem}.pem"),
        "--tls-key",
        str(tmp_path / f"{stem}.key"),
        "--tls-ca",
        str(tmp_path / "ca.pem"),
    ]
