"""Settings the edge inherits but cannot honour are refused at start, never
ignored: ``probe_port`` comes with the mesh identity settings every plane
shares, but the edge serves HTTP, not gRPC, so no grpc.health.v1 could
answer on it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from llmmesh.core import config
from llmmesh.edge.settings import EdgeSettings


def test_a_probe_port_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match=r"probe_port \(50070\) is for gRPC planes: the edge serves no gRPC"):
        EdgeSettings(probe_port=50070)
    with pytest.raises(ValueError, match="unset LLMMESH_PROBE_PORT"):
        config.load(EdgeSettings, environ={"LLMMESH_PROBE_PORT": "50070"})
    assert config.load(EdgeSettings, environ={"LLMMESH_PROBE_PORT": "0"}).probe_port == 0


def test_the_edge_command_stops_at_start_with_the_reason(tmp_path: os.PathLike[str]) -> None:
    env = {**os.environ, "LLMMESH_HOME": str(tmp_path), "LLMMESH_PROBE_PORT": "50070"}
    done = subprocess.run(
        [sys.executable, "-m", "llmmesh", "edge", "--insecure", "--port", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "llmmesh edge: probe_port (50070) is for gRPC planes" in done.stderr
