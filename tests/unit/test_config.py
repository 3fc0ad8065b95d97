"""Config validation: errors name the value, the reason and the fix."""

import pytest

from rlcoach import ConfigError, EngineConfig, TrainableModel, TrainConfig
from rlcoach.config import check_name, parse_config


@pytest.mark.parametrize(
    "name", ["", "../evil", "a/b", ".hidden", "x" * 101, "sp ace", 7, "calc\n", "calc\r\n"]
)
def test_unsafe_names_are_refused(name):
    with pytest.raises(ConfigError, match="safe path component") as info:
        check_name("model", name)
    assert repr(name) in str(info.value)
    assert "fix:" in str(info.value)


def test_trainable_model_checks_its_names():
    with pytest.raises(ConfigError, match=r"project name '\.\./x'"):
        TrainableModel("agent", "../x")


def test_unknown_field_is_named_with_the_valid_ones():
    with pytest.raises(ConfigError) as info:
        parse_config(TrainConfig, {"learning_rte": 1e-4})
    message = str(info.value)
    assert "learning_rte" in message
    assert "learning_rate" in message  # the fix lists valid fields


def test_bad_value_is_named():
    with pytest.raises(ConfigError, match=r"learning_rate=-1\.0"):
        parse_config(TrainConfig, {"learning_rate": -1.0})
    with pytest.raises(ConfigError, match="kind='tgi'"):
        parse_config(EngineConfig, {"kind": "tgi"})


def test_missing_chat_template_file():
    with pytest.raises(ConfigError, match=r"does-not-exist\.jinja"):
        parse_config(EngineConfig, {"chat_template": "/tmp/does-not-exist.jinja"})


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_defaults_validate_and_nested_dicts_parse():
    config = parse_config(TrainConfig, {"lora": {"rank": 4}})
    assert config.lora.rank == 4
    assert parse_config(TrainConfig, config) is config


@pytest.mark.parametrize(
    "field,value",
    [
        ("mini_batches", 10**6),
        ("micro_batch_tokens", 10**9),
        ("logprob_chunk_tokens", 10**9),
    ],
)
def test_work_sizes_have_upper_bounds(field, value):
    with pytest.raises(ConfigError, match=field):
        parse_config(TrainConfig, {field: value})


def test_sft_epochs_are_bounded():
    from rlcoach.config import SFTConfig

    with pytest.raises(ConfigError, match="epochs"):
        parse_config(SFTConfig, {"epochs": 10**6})
