"""A pod killed mid-stream in a zone with one region: the region hands its
turns to the region's other pod, so no turn fails and no token is lost or
repeated although the edge has no other region to go to."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import RunningMesh, start_up, stop_up
from tests.e2e.drills import assert_clean, drill

pytestmark = pytest.mark.e2e

ONE_REGION = """\
[mesh]
edge_port = 0
[zones.us.regions.us-east]
pods = 2
"""


@pytest.fixture(scope="module")
def one_region(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    home = tmp_path_factory.mktemp("llmmesh-one-region")
    config = home / "mesh.toml"
    config.write_text(ONE_REGION)
    with pytest.MonkeyPatch.context() as env:
        # The regions `llmmesh up` starts read their settings from the environment it passes on.
        # A pod's stall is the region's to see before the edge's stall timeout (3 s) sees the
        # stream's: under it, as the setting asks, by a margin a loaded machine keeps.
        env.setenv("LLMMESH_POD_STALL_MS", "2000")
        running = start_up(
            home, "--config", str(config), "--dev-key", "sk-llmmesh-one-region", "--redis", "none"
        )
    yield running
    if running.process.poll() is None:
        status, out = stop_up(running)
        assert status == 0, out


def counted(metrics_url: str, counter: str) -> float:
    """The sum of a region counter's series (``llmmesh_region_…_total``) on its /metrics."""
    text = httpx.get(metrics_url, timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(f"{counter}{{"))


def turns_taken_over(metrics_url: str) -> float:
    """Turns another pod of the region took after theirs failed: mid-stream, or before any output."""
    return counted(metrics_url, "llmmesh_region_turns_moved_total") + counted(
        metrics_url, "llmmesh_region_turns_placed_again_total"
    )


def test_killing_a_pod_of_the_only_region_fails_no_turn(one_region: RunningMesh) -> None:
    metrics = one_region.info["metrics"]
    assert isinstance(metrics, dict)
    metrics_url = str(metrics["us-east"])
    taken_over = turns_taken_over(metrics_url)
    # The kind's former name, engine-pod, still runs it; the report names it pod.
    # No --pod: the drill kills the pod running most generations, so the kill reaches turns.
    report = drill(one_region, "--kind", "engine-pod", "--region", "us-east")
    assert_clean(report)
    assert report["kind"] == "pod"
    assert report["streams_affected"] >= 1
    assert report["turns_failed_clearly"] == 0, report["errors"]
    assert report["tokens_lost"] == 0 and report["sequence_gaps"] == 0
    assert report["usage"]["difference"] == 0, report["usage"]
    # The turns went on in us-east, on the other pod: the edge had nowhere else to go.
    assert turns_taken_over(metrics_url) > taken_over


def test_freezing_a_pod_of_the_only_region_fails_no_turn(one_region: RunningMesh) -> None:
    # SIGSTOP: the frozen pod's connections stay open and answer nothing.
    # Its turns in flight stall and go on on the other pod; turns placed on
    # it before its health checks failed are placed again once they fail.
    metrics = one_region.info["metrics"]
    assert isinstance(metrics, dict)
    metrics_url = str(metrics["us-east"])
    stalls = counted(metrics_url, "llmmesh_region_pod_stalls_total")
    # Frozen for 6 s: well past both ways the region finds a frozen pod (its turns' 2 s stall,
    # two failed health checks for the turns waiting on it), on a loaded machine too.
    report = drill(
        one_region, "--kind", "pod", "--mode", "partition", "--region", "us-east", "--restore-after-s", "6"
    )
    assert_clean(report)
    assert report["streams_affected"] >= 1
    assert report["turns_failed_clearly"] == 0, report["errors"]
    assert report["tokens_lost"] == 0 and report["sequence_gaps"] == 0
    assert report["usage"]["difference"] == 0, report["usage"]
    assert counted(metrics_url, "llmmesh_region_pod_stalls_total") > stalls
