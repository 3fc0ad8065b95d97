"""GPU placement: defaults derived from the visible GPUs, validation, vLLM's view."""

import pytest

from rlcoach.config import EngineConfig, parse_config
from rlcoach.errors import ConfigError
from rlcoach.runtime.placement import PlacementConfig, resolve_placement


def test_no_gpu_places_nothing_and_refuses_named_gpus():
    assert resolve_placement(PlacementConfig(), 0) is None
    with pytest.raises(ConfigError, match="no GPU is visible"):
        resolve_placement(PlacementConfig(serve_gpus=[0]), 0)


def test_one_gpu_is_shared_by_vllm_and_the_trainer():
    placement = resolve_placement(PlacementConfig(), 1)
    assert placement.colocated and placement.train_device() == "cuda:0"
    assert placement.vllm_args() == [] and placement.vllm_env() == {"CUDA_VISIBLE_DEVICES": "0"}


@pytest.mark.parametrize(("visible", "serve"), [(2, (0,)), (4, (0, 1, 2)), (8, tuple(range(7)))])
def test_several_gpus_dedicate_the_last_to_training(visible, serve):
    placement = resolve_placement(PlacementConfig(), visible)
    assert placement.serve_gpus == serve and placement.train_gpus == (visible - 1,)
    assert not placement.colocated
    assert placement.tensor_parallel == len(serve)
    expected = ["--tensor-parallel-size", str(len(serve))] if len(serve) > 1 else []
    assert placement.vllm_args() == expected


def test_data_parallel_replicas_split_the_serving_gpus():
    config = PlacementConfig(serve_gpus=[0, 1, 2, 3], train_gpus=[4], data_parallel=2)
    placement = resolve_placement(config, 8)
    assert (placement.tensor_parallel, placement.data_parallel) == (2, 2)
    assert placement.vllm_args() == ["--tensor-parallel-size", "2", "--data-parallel-size", "2"]


def test_one_side_given_the_other_is_derived():
    assert resolve_placement(PlacementConfig(serve_gpus=[1, 2]), 4).train_gpus == (3,)
    assert resolve_placement(PlacementConfig(train_gpus=[0]), 3).serve_gpus == (1, 2)


def test_vllm_sees_its_gpus_through_the_users_visible_devices():
    placement = resolve_placement(PlacementConfig(serve_gpus=[0, 1], train_gpus=[2]), 3)
    assert placement.vllm_env("4,5,6") == {"CUDA_VISIBLE_DEVICES": "4,5"}


@pytest.mark.parametrize(
    ("config", "visible", "message"),
    [
        (PlacementConfig(serve_gpus=[0, 5]), 4, "names GPU 5, but this host has 4"),
        (PlacementConfig(serve_gpus=[1, 1]), 4, "lists a GPU twice"),
        (PlacementConfig(serve_gpus=[0], train_gpus=[0, 1]), 4, "shares GPU 0"),
        (PlacementConfig(cpu_train_ranks=2), 1, "cpu_train_ranks=2 asks for CPU"),
        (PlacementConfig(serve_gpus=[0, 1], train_gpus=[1]), 4, "shares GPU 1"),
        (PlacementConfig(serve_gpus=[0, 1, 2], tensor_parallel=2), 4, "does not match"),
    ],
)
def test_bad_placements_name_the_value_and_the_fix(config, visible, message):
    with pytest.raises(ConfigError, match=message) as error:
        resolve_placement(config, visible)
    assert "fix:" in str(error.value)


def test_several_training_gpus_get_one_rank_each_through_their_visible_devices():
    placement = resolve_placement(PlacementConfig(train_gpus=[2, 3]), 4)
    assert placement.train_gpus == (2, 3) and placement.serve_gpus == (0, 1)
    assert not placement.colocated
    assert placement.train_env() == {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert placement.train_env("4,5,6,7") == {"CUDA_VISIBLE_DEVICES": "6,7"}


def test_cpu_train_ranks_are_only_for_a_host_without_gpus():
    assert resolve_placement(PlacementConfig(cpu_train_ranks=2), 0) is None
    with pytest.raises(ConfigError, match=r"placement\.cpu_train_ranks=-1"):
        parse_config(EngineConfig, {"placement": {"cpu_train_ranks": -1}})


def test_the_engine_config_carries_a_placement():
    config = EngineConfig(placement={"serve_gpus": [0], "train_gpus": [1]})
    assert resolve_placement(config.placement, 2).train_device() == "cuda:1"
