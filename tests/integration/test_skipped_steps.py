"""Skipped steps keep their trajectories and their own records, through a real LocalBackend.

A tiny random-weight model (tests/conftest.py) on the in-process transformers engine
trains for real; groups whose rewards are all equal make a step skip. Before the fix the
skipped attempts' groups went to the next step's file, overwritten by the next attempt,
and their metrics lines carried the previous step's number.
"""

import json

from rlcoach import LocalBackend, SampledChoice, TrainableModel, Trajectory, TrajectoryGroup
from rlcoach.observe.report import _step_rows, read_run, write_report
from rlcoach.paths import RunPaths


def group(rewards: list[float], tag: str) -> TrajectoryGroup:
    trajectories = []
    for index, reward in enumerate(rewards):
        choice = SampledChoice(
            message={"role": "assistant", "content": "x"},
            prompt_token_ids=[1, 2, 3],
            token_ids=[4 + index, 5],
            logprobs=[-1.0, -1.0],
            policy="skips@0",
        )
        trajectories.append(Trajectory(id=f"{tag}-{index}", choices=[choice], reward=reward))
    return TrajectoryGroup(trajectories)


async def test_skipped_attempts_get_their_own_files_and_records(tmp_path, tiny_model_path):
    backend = LocalBackend(tmp_path, engine={"kind": "transformers"})
    model = TrainableModel("skips", "p", base_model=str(tiny_model_path))
    await model.register(backend)
    for tag in ("a", "b"):
        result = await model.train([group([1.0, 1.0], tag)])
        assert not result.stats.trained and model.step == 0
    await model.train([group([1.0, 0.0], "c<script>")])
    assert model.step == 1
    await backend.close()

    paths = RunPaths(tmp_path, "p", "skips")
    files = sorted(p.name for p in paths.trajectories.iterdir())
    assert files == ["000001-skip1.jsonl", "000001-skip2.jsonl", "000001.jsonl"]
    ids = {}
    for name in files:
        lines = (paths.trajectories / name).read_text().splitlines()
        ids[name] = [json.loads(line)["trajectories"][0]["id"] for line in lines]
    assert ids == {
        "000001-skip1.jsonl": ["a-0"],
        "000001-skip2.jsonl": ["b-0"],
        "000001.jsonl": ["c<script>-0"],
    }
    records = [json.loads(line) for line in paths.metrics.read_text().splitlines()]
    assert [(r["step"], r["event"], r.get("skip"), r.get("model_step")) for r in records] == [
        (1, "skipped", 1, 0),
        (1, "skipped", 2, 0),
        (1, "train", None, None),
    ]
    run = read_run(paths.dir)
    assert [row["label"] for row in _step_rows(run)] == ["1 (skip 1)", "1 (skip 2)", "1"]
    page = write_report(paths.dir, samples_per_step=2).read_text()
    assert "c&lt;script&gt;-0" in page and "c<script>" not in page
    assert "skipped attempt 2" in page
