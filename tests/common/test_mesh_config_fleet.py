"""A topology that deploys several models: pods per model per region."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmmesh.cli.fleet_bootstrap import pod_env, registry_entry
from llmmesh.core.model_family import LARGE, SMALL
from llmmesh.topology.mesh_config import MeshConfigError, load_mesh_config, parse_mesh_config
from llmmesh.v1 import model_registry_service_pb2 as mpb

FLEET = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "fleet.toml"


def test_the_fleet_example_deploys_small_and_large_in_every_region() -> None:
    config = load_mesh_config(FLEET)
    assert [r.name for r in config.regions()] == ["us-east", "us-west", "eu-west"]
    for region in config.regions():
        assert region.pods == 2
        assert [m for _, m in region.pod_models()] == ["llmmesh-small", "llmmesh-large"]
        assert region.pod_ids() == [pod for pod, _ in region.pod_models()]


def test_a_region_without_models_keeps_its_pods_of_the_default_model() -> None:
    config = parse_mesh_config("[zones.us.regions.us-east]\npods = 2\n")
    region = next(config.regions())
    assert region.models == () and region.pod_models() == [("us-east-pod-0", ""), ("us-east-pod-1", "")]


def test_pods_may_repeat_the_sum_of_the_models() -> None:
    text = "[zones.us.regions.us-east]\npods = 3\n[zones.us.regions.us-east.models]\na = 1\nb = 2\n"
    region = next(parse_mesh_config(text).regions())
    assert region.pod_models() == [("us-east-pod-0", "a"), ("us-east-pod-1", "b"), ("us-east-pod-2", "b")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pods = 3\n[zones.us.regions.us-east.models]\na = 1\n", "zones.us.regions.us-east.pods is 3"),
        (
            "[zones.us.regions.us-east.models]\na = 0\n",
            "zones.us.regions.us-east.models.a must be at least 1",
        ),
        ("[zones.us.regions.us-east.models]\nauto = 1\n", "'auto' cannot be a model name"),
        ('[zones.us.regions.us-east.models]\na = "1"\n', "models.a must be an integer"),
        ("models = 2\n", "zones.us.regions.us-east.models must be a table"),
    ],
)
def test_model_mistakes_name_the_key(text: str, message: str) -> None:
    with pytest.raises(MeshConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_mesh_config("[zones.us.regions.us-east]\n" + text)


def test_pods_of_family_models_get_their_size_and_simulated_costs() -> None:
    env = pod_env("sim", LARGE.name)
    assert env["LLMMESH_MODEL"] == LARGE.name
    assert float(env["LLMMESH_SIM_INTER_TOKEN_S"]) == LARGE.sim_timing()["sim_inter_token_s"]
    assert float(env["LLMMESH_SIM_PREFILL_PER_TOKEN_S"]) > float(
        pod_env("sim", SMALL.name)["LLMMESH_SIM_PREFILL_PER_TOKEN_S"]
    )
    assert pod_env("sim", "") == {}
    assert pod_env("sim", "someone-elses-model") == {"LLMMESH_MODEL": "someone-elses-model"}


def test_family_models_register_with_their_tier_and_prices() -> None:
    entry = registry_entry(LARGE)
    assert (entry.tier, entry.pricing.output_per_1k_usd) == (mpb.MODEL_TIER_LARGE, LARGE.output_per_1k_usd)
    assert not entry.default_for_tiers


def test_a_vllm_pod_of_a_family_model_gets_its_built_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMMESH_HOME", str(tmp_path))
    env = pod_env("vllm", SMALL.name)
    built = Path(env["LLMMESH_MODEL_PATH"])
    assert built == tmp_path / "models" / SMALL.name
    assert json.loads((built / "config.json").read_text())["num_hidden_layers"] == SMALL.num_layers
    # Built once: the second pod of the model finds it.
    stamp = (built / "config.json").stat().st_mtime_ns
    assert pod_env("vllm", SMALL.name) == env and (built / "config.json").stat().st_mtime_ns == stamp
    # llmmesh-tiny is the engine's own default build.
    assert pod_env("vllm", "llmmesh-tiny") == {"LLMMESH_MODEL": "llmmesh-tiny"}
