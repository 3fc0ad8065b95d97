"""The error tree: every public exception is an RLCoachError, each category also the
standard error it replaces, configs raise ConfigError however they are built, and the
public names of rlcoach and its plugins are pinned."""

import importlib
import inspect
import json
import pkgutil
import re

import pytest
from pydantic import BaseModel

import rlcoach
import rlcoach.autorl
import rlcoach.integrations
import rlcoach.ruler
import rlcoach.ruler.judge
from rlcoach import (
    ConfigError,
    EngineConfig,
    Model,
    RLCoachError,
    TrainableModel,
    TrainConfig,
    gather_trajectory_groups,
    load_groups,
)
from rlcoach import errors as tree
from rlcoach.answers import json_object
from rlcoach.config import Config, parse_config
from rlcoach.distill import collect_demonstrations
from rlcoach.families import family_named


def _modules() -> list[str]:
    names = set()
    for package in (rlcoach, rlcoach.ruler, rlcoach.autorl, rlcoach.integrations):
        names.add(package.__name__)
        for found in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            names.add(found.name)
    return sorted(names)


MODULES = _modules()


def _public_classes(base: type) -> dict[str, type]:
    """Classes derived from `base` defined in rlcoach, under names with no private part."""
    found = {}
    for name in MODULES:
        if any(part.startswith("_") for part in name.split(".")):
            continue
        module = importlib.import_module(name)
        for attribute, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, base)
                and value.__module__ == name
                and not attribute.startswith("_")
            ):
                found[f"{name}.{attribute}"] = value
    return found


def test_every_public_exception_is_an_rlcoach_error():
    exceptions = _public_classes(BaseException)
    assert len(MODULES) > 60 and len(exceptions) >= 20  # the walk reached the plugins
    assert {
        "rlcoach.ruler.judge.JudgeError",
        "rlcoach.integrations.mcp.tools.SchemaError",
        "rlcoach.autorl.generate.GenerationError",
    } <= set(exceptions)
    outside = sorted(name for name, cls in exceptions.items() if not issubclass(cls, RLCoachError))
    assert outside == []


@pytest.mark.parametrize(
    ("error", "standard"),
    [
        (tree.ConfigError, ValueError),
        (tree.DataError, ValueError),
        (tree.TrainingDataError, tree.DataError),
        (tree.AnswerError, ValueError),
        (tree.UsageError, TypeError),
        (tree.MissingDependencyError, ImportError),
        (tree.UnknownNameError, KeyError),
        (tree.UnknownModelError, LookupError),
        (tree.EngineError, RuntimeError),
        (tree.EngineHTTPError, tree.EngineError),
        (tree.CheckpointError, OSError),
        (rlcoach.ruler.judge.AnswerError, ValueError),
        (rlcoach.integrations.mcp.SchemaError, ValueError),
    ],
)
def test_each_category_is_also_the_standard_error_it_replaces(error, standard):
    assert issubclass(error, RLCoachError) and issubclass(error, standard)


def test_plugins_reexport_the_core_classes_not_copies():
    from rlcoach.engines.base import EngineHTTPError

    assert rlcoach.ruler.judge.AnswerError is tree.AnswerError
    assert EngineHTTPError is tree.EngineHTTPError


# -- pinned public names (like httpx's test_exported_members) ---------------------------

EXPORTED = {
    "rlcoach": [
        "AfterEach",
        "BUNDLED_MODEL",
        "Backend",
        "ChatRecord",
        "CheckpointError",
        "ClientChoice",
        "ConfigError",
        "DatasetBatch",
        "EngineConfig",
        "EngineError",
        "EngineStartError",
        "History",
        "LocalBackend",
        "LoraConfig",
        "Messages",
        "MessagesAndChoices",
        "Model",
        "ModelUsage",
        "PendingStep",
        "PipelineStep",
        "RLCoachError",
        "RemoteBackend",
        "RemoteError",
        "Rollout",
        "RolloutError",
        "RolloutFailure",
        "RolloutFn",
        "SFTConfig",
        "SampledChoice",
        "Sink",
        "SinkConfig",
        "StepResult",
        "TrainConfig",
        "TrainableModel",
        "TrainerError",
        "TrainingDataError",
        "Tools",
        "Trajectory",
        "TrajectoryGroup",
        "UnknownModelError",
        "Verdict",
        "__version__",
        "current_rollout_id",
        "gather_trajectories",
        "gather_trajectory_groups",
        "iterate_dataset",
        "load_groups",
        "run_pipeline",
        "retry",
        "save_groups",
        "tool_message",
    ],
    "rlcoach.errors": [
        "AnswerError",
        "CheckpointError",
        "ConfigError",
        "DataError",
        "EngineError",
        "EngineHTTPError",
        "EngineStartError",
        "MissingDependencyError",
        "RLCoachError",
        "RemoteError",
        "RolloutError",
        "ToolSchemaError",
        "TrainerError",
        "TrainingDataError",
        "UnknownModelError",
        "UnknownNameError",
        "UsageError",
    ],
    "rlcoach.ruler": [
        "Candidate",
        "DEFAULT_RUBRIC",
        "JudgeError",
        "JudgeScore",
        "JudgeUsage",
        "RulerConfig",
        "after_each",
        "judge_usage",
        "render_group",
        "score",
        "score_candidates",
        "score_group",
    ],
    "rlcoach.autorl": [
        "Fact",
        "GroundedCall",
        "facts_score",
        "grounded_scenarios",
        "key_facts",
        "split_by_call",
        "DifficultyFilter",
        "FilterReport",
        "GenerationConfig",
        "GenerationError",
        "InputRecord",
        "check_solvable",
        "deduplicate",
        "describe_tools",
        "generate_inputs",
        "generate_scenarios",
        "generate_system_prompt",
        "group_input_id",
        "load_records",
        "normalize_text",
        "save_dataset",
        "split_records",
    ],
    "rlcoach.integrations": [],
    "rlcoach.integrations.langfuse": ["LangfuseConfig", "LangfuseSink", "STEP_SCORES", "trace_id"],
    "rlcoach.integrations.langgraph": [
        "GraphRollout",
        "chat_model",
        "rollout",
        "rollout_fn",
        "to_openai_messages",
    ],
    "rlcoach.integrations.mcp": [
        "ArgumentSynthesizer",
        "Exploration",
        "ToolSafety",
        "explore",
        "grounded_check",
        "judge_tool",
        "AgentConfig",
        "AgentRun",
        "CallCheck",
        "Connection",
        "Example",
        "MCPServerError",
        "MCPTrainConfig",
        "RolloutTimeoutError",
        "SchemaError",
        "ServerSpec",
        "ToolResult",
        "ToolSet",
        "ToolTimeoutError",
        "build_demonstration",
        "connect",
        "convert_tools",
        "discover",
        "ruler_rewards",
        "run_agent",
        "tool_use_check",
        "train_on_server",
    ],
    "rlcoach.integrations.wandb": ["TABLE_COLUMNS", "WandbConfig", "WandbSink"],
}


@pytest.mark.parametrize("package", sorted(EXPORTED))
def test_exported_members_are_pinned(package):
    # Adding or removing a public name is an API change: update this list on purpose.
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(EXPORTED[package])
    assert len(set(module.__all__)) == len(module.__all__)
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.__all__ names {name}, which it lacks"


def test_every_exception_a_package_exports_is_in_the_tree():
    for package in EXPORTED:
        module = importlib.import_module(package)
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) and issubclass(value, BaseException):
                assert issubclass(value, RLCoachError), f"{package}.{name}"


# -- configs raise ConfigError however they are built -----------------------------------


BUILDERS = {
    "constructor": lambda: TrainConfig(learning_rate=-1),
    "model_validate": lambda: TrainConfig.model_validate({"learning_rate": -1}),
    "model_validate_json": lambda: TrainConfig.model_validate_json('{"learning_rate": -1}'),
    "model_validate_strings": lambda: TrainConfig.model_validate_strings({"learning_rate": "-1"}),
    "parse_config": lambda: parse_config(TrainConfig, {"learning_rate": -1}),
    "a dict to TrainableModel": lambda: TrainableModel(
        "agent", "errors", config={"learning_rate": -1}
    ),
}


@pytest.mark.parametrize("route", sorted(BUILDERS))
def test_a_bad_value_raises_config_error_however_the_config_is_built(route):
    with pytest.raises(ConfigError) as info:
        BUILDERS[route]()
    message = str(info.value)
    assert re.search(r"TrainConfig\.learning_rate='?-1", message)  # the field and the value
    assert "greater than 0" in message  # the reason
    assert "fix: use a number greater than 0.0 and at most 1.0" in message  # the fix


def test_nested_and_several_problems_are_each_located_once():
    with pytest.raises(ConfigError) as info:
        TrainConfig.model_validate({"lora": {"rank": 0, "alpah": 3}, "loss": "ppo"})
    message = str(info.value)
    assert message.startswith("invalid TrainConfig: ")
    assert "TrainConfig.lora.rank=0" in message and "at least 1 and at most 256" in message
    assert "LoraConfig has no field 'alpah'; fix: did you mean 'alpha'?" in message
    assert "TrainConfig.loss='ppo'" in message
    assert "fix: use one of 'grpo', 'dr_grpo' or 'cispo'" in message
    assert message.count("invalid") == 1  # nested configs are not reported twice


def test_misspelt_missing_frozen_and_wrong_kind_say_the_fix():
    with pytest.raises(ConfigError, match=r"did you mean 'learning_rate'\? remove it"):
        TrainConfig(lerning_rate=1e-4)
    with pytest.raises(ConfigError, match=r"ServerSpec: got command=None and url=None.*fix:"):
        rlcoach.integrations.mcp.ServerSpec()
    with pytest.raises(ConfigError, match=r"TrainConfig\.seed: TrainConfig is frozen.*model_copy"):
        TrainConfig().seed = 3
    with pytest.raises(ConfigError, match=r"mini_batches='x'.*fix: pass a valid integer$"):
        TrainConfig(mini_batches="x")
    with pytest.raises(ConfigError, match=r"EngineConfig\.port=70000.*at most 65535"):
        EngineConfig(port=70000)


def test_every_config_model_is_a_config():
    # Anything named *Config (and the MCP server spec) validates through `Config`, so no
    # route to building one raises pydantic's ValidationError.
    models = _public_classes(BaseModel)
    configs = {n: c for n, c in models.items() if n.endswith("Config") or n.endswith("Spec")}
    assert len(configs) >= 12
    assert sorted(n for n, c in configs.items() if not issubclass(c, Config)) == []
    for cls in configs.values():
        with pytest.raises(ConfigError, match=r"has no field 'no_such_setting'.*fix:"):
            cls.model_validate({"no_such_setting": 1})


# -- raise sites on public paths --------------------------------------------------------


def test_an_unknown_family_is_a_key_error_with_a_readable_message():
    with pytest.raises(KeyError) as info:
        family_named("falcon")
    assert isinstance(info.value, tree.UnknownNameError)
    assert str(info.value).startswith("no model family 'falcon'")  # not KeyError's quoting
    assert "fix: use one of" in str(info.value) and "qwen3" in str(info.value)


def test_an_answer_without_json_is_an_answer_error():
    with pytest.raises(tree.AnswerError, match=r"no JSON object.*fix:"):
        json_object("I think the first one is better.")
    with pytest.raises(ValueError, match=r"not valid JSON.*fix:"):
        json_object('{"a": 1,}')


def test_a_bad_groups_file_names_the_line(tmp_path):
    path = tmp_path / "groups.jsonl"
    path.write_text(json.dumps({"trajectories": []}) + "\n" + '{"trajectories": 3}\n')
    with pytest.raises(tree.DataError, match=r"groups\.jsonl:2 is not a trajectory group.*fix:"):
        load_groups(path)


async def test_a_rollout_that_returns_no_trajectory_is_recorded_as_a_usage_error():
    async def not_a_trajectory():
        return {"reward": 1.0}

    [group] = await gather_trajectory_groups(
        [[not_a_trajectory()]], progress=False, max_failure_fraction=1.0
    )
    [failure] = group.failures
    assert failure.type == "UsageError" and "fix: return `rollout.trajectory`" in failure.message


async def test_argument_checks_raise_config_error():
    with pytest.raises(ConfigError, match=r"samples_per_task=0.*fix"):
        await collect_demonstrations(Model("teacher"), None, [], samples_per_task=0)
    with pytest.raises(ConfigError, match=r"weight=1\.5.*fix"):
        rlcoach.integrations.mcp.ruler_rewards(Model("judge"), None, weight=1.5)
    with pytest.raises(ConfigError, match=r"task_description='  '.*fix"):
        await rlcoach.autorl.generate_inputs("  ", 3, Model("generator"))
    with pytest.raises(ConfigError, match=r"n=0.*fix"):
        await rlcoach.autorl.generate_inputs("answer mail", 0, Model("generator"))


def test_the_engine_refusal_carries_status_and_body_and_a_fix():
    error = tree.EngineHTTPError(400, {"error": {"message": "bad tools"}})
    assert (error.status, error.body) == (400, {"error": {"message": "bad tools"}})
    assert "HTTP 400" in str(error) and "fix: fix the request" in str(error)
    assert "fix: retry" in str(tree.EngineHTTPError(503, {}))


def test_chat_model_refuses_options_it_sets_itself():
    from rlcoach.integrations.langgraph import chat_model

    with pytest.raises(TypeError) as info:
        chat_model(Model("helper", base_url="http://127.0.0.1:9/v1"), base_url="http://x")
    assert isinstance(info.value, tree.UsageError) and "'base_url'" in str(info.value)
