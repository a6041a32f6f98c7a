"""How long ``llmmesh up`` waits for its planes: longer where a pod runs
vLLM, whatever ``--startup-timeout`` says when given. No mesh is started."""

from __future__ import annotations

import argparse

import pytest

from llmmesh.cli.up import (
    STARTUP_TIMEOUT_S,
    VLLM_STARTUP_TIMEOUT_S,
    add_up_arguments,
    mesh_config_of,
    startup_timeout_s,
)


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="llmmesh up", exit_on_error=False)
    add_up_arguments(parser)
    return parser.parse_args(list(argv))


def timeout_of(*argv: str) -> float:
    args = parsed(*argv)
    config, _ = mesh_config_of(args)
    return startup_timeout_s(args, config)


def test_a_mesh_with_vllm_pods_waits_longer_for_them_unless_told() -> None:
    assert timeout_of() == STARTUP_TIMEOUT_S == 120.0
    assert timeout_of("--engine", "vllm") == VLLM_STARTUP_TIMEOUT_S > STARTUP_TIMEOUT_S
    assert timeout_of("--engine", "vllm", "--startup-timeout", "45.5") == 45.5
    assert timeout_of("--startup-timeout", "900") == 900.0


@pytest.mark.parametrize("bad", ["0", "-3", "inf", "nan", "soon"])
def test_a_startup_timeout_that_is_no_positive_number_is_refused(bad: str) -> None:
    with pytest.raises(argparse.ArgumentError, match="--startup-timeout") as refused:
        parsed("--startup-timeout", bad)
    assert "seconds" in str(refused.value)
