"""AutoRL: training inputs from a task description or tool list (`rlcoach.autorl`).

Imports only `rlcoach`. Generate inputs (`generate_inputs`) or tool-use scenarios
(`generate_scenarios`) with any OpenAI-compatible model; remove exact and near
duplicates (`deduplicate`) and the inputs the generator judges unsolvable
(`check_solvable`); write a system prompt (`generate_system_prompt`); split the inputs
deterministically into train and eval and save them as JSONL (`split_records`,
`save_dataset`); write grounded scenarios from tool calls that worked, each with the
key facts of the real result as its answer key (`grounded_scenarios`, `key_facts`,
`split_by_call`), kept only when no trivial reply earns them (`drop_gameable`); during
training skip the inputs whose groups stopped teaching (`DifficultyFilter`).
"""

from rlcoach.autorl.check import check_solvable
from rlcoach.autorl.curriculum import DifficultyFilter, FilterReport, group_input_id
from rlcoach.autorl.dedupe import deduplicate, normalize_text
from rlcoach.autorl.facts import Fact, facts_score, key_facts
from rlcoach.autorl.gameable import drop_gameable
from rlcoach.autorl.generate import (
    GenerationConfig,
    GenerationError,
    describe_tools,
    generate_inputs,
    generate_scenarios,
)
from rlcoach.autorl.grounded import GroundedCall, grounded_scenarios, split_by_call
from rlcoach.autorl.prompt import generate_system_prompt
from rlcoach.autorl.split import load_records, save_dataset, split_records
from rlcoach.autorl.types import InputRecord

__all__ = [
    "DifficultyFilter",
    "Fact",
    "FilterReport",
    "GenerationConfig",
    "GenerationError",
    "GroundedCall",
    "InputRecord",
    "check_solvable",
    "deduplicate",
    "describe_tools",
    "drop_gameable",
    "facts_score",
    "generate_inputs",
    "generate_scenarios",
    "generate_system_prompt",
    "grounded_scenarios",
    "group_input_id",
    "key_facts",
    "load_records",
    "normalize_text",
    "save_dataset",
    "split_by_call",
    "split_records",
]
