"""`MCPTrainConfig`: everything `rlcoach mcp train` is told (the CLI builds one from its
flags), and `Endpoint`, a helper model reached over an OpenAI-compatible API (the judge,
the scenario generator).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ConfigDict, Field

from rlcoach.integrations.mcp.agent import AgentConfig, Example
from rlcoach.integrations.mcp.connection import ServerSpec
from rlcoach.model import Model
from rlcoach.models.bundled import BUNDLED_MODEL
from rlcoach.validation import Config

__all__ = ["Endpoint", "MCPTrainConfig"]


class Endpoint(Config):
    """An OpenAI-compatible model: a generator or a judge."""

    model_config = ConfigDict(extra="forbid")

    url: str
    model: str
    api_key_env: str | None = None

    def as_model(self) -> Model:
        return Model(self.model, base_url=self.url, api_key_env=self.api_key_env)


class MCPTrainConfig(Config):
    model_config = ConfigDict(extra="forbid")

    server: ServerSpec
    base_model: str = BUNDLED_MODEL
    name: str | None = None
    """The trained model's name (default `<server>-<time>`); an existing one resumes."""
    steps: int = Field(6, ge=0)
    """RL steps this run (after any warm-up; a resumed model trains this many more)."""
    scenarios: int = Field(32, ge=2)
    """Grounded scenarios to write (ignored with `scenarios_file`)."""
    scenarios_file: Path | None = None
    """A JSONL of AutoRL input records (e.g. from `rlcoach autorl generate --mcp`)."""
    eval_fraction: float = Field(0.25, gt=0.0, lt=1.0)
    scenarios_per_step: int = Field(4, ge=1)
    """Training scenarios a step samples (each `group_size` times): after the SFT
    warm-up most groups agree, and two a step gave GRPO too little to learn from."""
    group_size: int = Field(4, ge=2)
    eval_samples: int = Field(1, ge=1)
    """Attempts per held-out scenario (more only help when `eval_temperature` > 0)."""
    eval_temperature: float = Field(0.0, ge=0.0, le=2.0)
    """The held-out split is evaluated greedily: the same model always scores the same,
    so checkpoints compare on what they learned, not on sampling luck (measured at
    temperature 1 with 2 attempts on 15 scenarios: the same SFT weights scored 0.167 and
    then 0.033). Training rollouts sample at `agent.temperature`."""
    agent: AgentConfig = Field(default_factory=AgentConfig)
    demonstration: bool = False
    """Put a worked example from a real call before each task (doubles the prompt; the
    SFT warm-up on the grounded calls teaches more)."""
    examples: list[Example] = Field(default_factory=list)
    """Worked examples to use instead of the automatic one (run against the server)."""
    warmup_epochs: int | None = Field(None, ge=0)
    """Before RL, fine-tune (SFT) this many epochs on the worked examples, framed as the
    agent frames a task (system prompt, tools); 0: no warm-up; None: `auto_warmup_epochs`
    when the base model's held-out success is below `warmup_below`. A small model that
    never calls a tool gives GRPO groups without reward variance; the warm-up gives it
    some."""
    auto_warmup_epochs: int = Field(4, ge=1)
    warmup_below: float = Field(0.1, ge=0.0, le=1.0)
    warmup_examples: int = Field(24, ge=1)
    """At most this many worked examples (one per training scenario with an answer key)."""
    warmup_tokens: int = Field(80_000, ge=1000)
    """And at most about this many tokens over all epochs (long tool lists make long
    examples: the LoRA step learns ~250 tokens/s on two CPU cores)."""
    allow_unsafe_tools: bool = False
    """Call while exploring, and offer the policy, the tools the safety rule finds unsafe
    (they still run in the private working directory and home)."""
    explore_budget_s: float = Field(180.0, gt=0.0)
    """Upper bound on exploring the server."""
    warmup_learning_rate: float = Field(1e-3, gt=0.0)
    generator: Endpoint | None = None
    """Rephrases the grounded scenarios and writes more (AutoRL); default: none, the
    scenarios come from the templates alone."""
    judge: Endpoint | None = None
    """RULER's judge; without one the reward is the agent's check alone."""
    judge_weight: float = Field(0.5, ge=0.0, le=1.0)
    check: str | None = None
    """`module:function` scoring an `AgentRun` in [0, 1]; default `grounded_check`."""
    learning_rate: float = Field(2e-4, gt=0.0)
    """The RL steps' (GRPO) learning rate, a fifth of the warm-up's: Adam moves every
    LoRA weight by about the learning rate whatever the gradient's size, and a GRPO step
    after the warm-up has a few groups of signal (measured on a SQL server at 1e-3:
    held-out reward fell at every step, 0.407 -> 0.237 in four, and calls to tools that
    do not exist came back, while the training batches' reward held at 0.37-0.55 and
    the gradient norm stayed at 0.08-0.15: each step fitted its few training calls)."""
    eval_every: int = Field(3, ge=0)
    """Evaluate the held-out split every this many RL steps (and after the last); 0: only
    after the last. The best checkpoint by held-out success is kept (`keep_best`)."""
    refill_rounds: int = Field(1, ge=0)
    """Dynamic sampling (DAPO): a group whose attempts all scored the same teaches nothing
    (after an SFT warm-up, most do), so its scenario is replaced by another training
    scenario and sampled again, up to this many rounds per step; the step then trains on
    the groups that differ. 0: train on the batch as drawn."""
    patience: int = Field(2, ge=1)
    """Stop RL after this many evaluations below the best since it was set (a tie is no
    fall)."""
    keep_best: bool = True
    """Serve the best checkpoint by held-out success at the end (the SFT warm-up's, or an
    RL step's), made the model's latest step when it is not; False: serve the last."""
    seed: int = 0
    engine: str = "vllm"
    root: Path = Path(".rlcoach")
    progress: bool = True
