"""Weighted rubrics and gates from real manifests: the arithmetic, the components every step logs
(``reward/<name>``), and the validation that names a missing rubric, a duplicate or a bad gate."""

from __future__ import annotations

import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from agilerl.assembly.checks import manifest_problems
from agilerl.assembly.env_factory import make_env_factory
from agilerl.data.composite import CompositeRubric, RubricEntry, RubricGate
from agilerl.data.qa_dataset import QADatasetEnv
from agilerl.data.rubric import Rubric
from agilerl.errors import ManifestError, RubricError
from agilerl.manifest.spec import load_manifest
from agilerl.rollout.collector import RolloutCollector
from agilerl.generation.policy import ScriptedPolicy
from agilerl.train.metrics import ProgressBar, reward_component_metrics

REWARD_PY = textwrap.dedent(
    '''
    def correct(completion, answer):
        return float(completion.strip() == str(answer))

    def style(completion):
        return {"short": float(len(completion) < 5), "polite": float("please" in completion)}
    '''
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("composite")
    pq.write_table(pa.table({"question": [f"{i}+{i}?" for i in range(8)], "answer": [str(2 * i) for i in range(8)]}), folder / "qa.parquet")
    (folder / "reward.py").write_text(REWARD_PY)
    return folder


def write(folder, name="m.yaml", **environment):
    env = {"env_type": "rollout", "dataset": "qa.parquet", "train_test_split": 0.5, **environment}
    path = folder / name
    path.write_text(yaml.safe_dump({"environment": env, "model": {"name_or_path": "tiny"}, "algorithm": {"name": "grpo"}}))
    return path


ENTRIES = [
    {"name": "correct", "rubric": "reward.py:correct", "weight": 1.0},
    {"name": "style", "rubric": "reward.py:style", "weight": 0.25},
    {"name": "exact", "rubric": "exact_match", "weight": 0.5},
]


def env_of(folder, **environment) -> QADatasetEnv:
    manifest = load_manifest(write(folder, **environment))
    return make_env_factory(manifest.environment, base_dir=manifest.base_dir)()


def step(env, text, row_index=0):
    env.reset(row_index=row_index)
    answer = env.data.splits.train[row_index]["answer"]
    return env.step(text.format(answer=answer))


def test_the_reward_is_the_weighted_sum_and_every_entry_and_part_is_a_component(folder):
    env = env_of(folder, rubrics=ENTRIES)
    _, reward, done, _, info = step(env, "{answer}")
    assert done and reward == pytest.approx(1.0 + 0.25 * 1.0 + 0.5)
    assert info["reward_components"] == {
        "correct": 1.0, "style": 1.0, "style.short": 1.0, "style.polite": 0.0, "exact": 1.0,
    }
    _, reward, *_ = step(env, "no, please")
    assert reward == pytest.approx(0.25 * 1.0)


def test_a_gate_zeroes_the_entries_it_names_unless_its_component_reaches_min(folder):
    gates = [{"component": "correct", "min": 1.0, "zeroes": ["style"]}]
    env = env_of(folder, rubrics=ENTRIES, rubric_gates=gates)
    assert step(env, "{answer}")[1] == pytest.approx(1.75)
    _, reward, _, _, info = step(env, "x")  # wrong and short: no credit for style
    assert reward == 0.0 and info["reward_components"]["style"] == 1.0  # the score is still logged


def test_a_gate_without_zeroes_zeroes_the_whole_reward_and_may_name_a_part(folder):
    gates = [{"component": "style.polite", "min": 1.0}]
    env = env_of(folder, rubrics=ENTRIES, rubric_gates=gates)
    assert step(env, "{answer}")[1] == 0.0
    assert step(env, "{answer} please")[1] == pytest.approx(0.25)  # polite, so the gate opens: style only


def test_rubric_name_stays_one_entry_of_weight_one_with_its_own_components(folder):
    env = env_of(folder, rubric_file_path="reward.py", rubric_name="style")
    _, reward, _, _, info = step(env, "hi")
    assert reward == 1.0 and info["reward_components"] == {"short": 1.0, "polite": 0.0}


@pytest.mark.parametrize(
    ("environment", "words"),
    [
        ({"rubrics": [ENTRIES[0], {**ENTRIES[1], "name": "correct"}]}, "the name 'correct' is used twice"),
        ({"rubrics": ENTRIES, "rubric_gates": [{"component": "speed"}]}, "'speed' is no rubric entry's name"),
        ({"rubrics": ENTRIES, "rubric_gates": [{"component": "correct", "zeroes": ["tone"]}]}, "zeroes 'tone'"),
        ({"rubrics": ENTRIES, "rubric_name": "exact_match"}, "not both"),
        ({}, "needs 'rubric_name'"),
        ({"rubric_name": "exact_match", "rubric_gates": [{"component": "reward"}]}, "list the rubric there"),
        ({"rubrics": [{"name": "Bad Name", "rubric": "exact_match"}]}, "name"),
        ({"rubrics": [{"name": "a", "rubric": "exact_match", "wieght": 2}]}, "wieght"),
    ],
)
def test_the_manifest_refuses_what_no_reward_could_be_built_from(folder, environment, words):
    with pytest.raises(ManifestError, match=words):
        load_manifest(write(folder, **environment))


def test_a_missing_rubric_is_named_by_its_entry(folder):
    entries = [ENTRIES[0], {"name": "tone", "rubric": "exact_macth"}, {"name": "f", "rubric": "nofile.py:f"}]
    for offline in (True, False):
        problems = manifest_problems(load_manifest(write(folder, rubrics=entries)), offline=offline)
        assert any(p.startswith("environment.rubrics.1.rubric:") and "exact_match" in p for p in problems), problems
        assert any(p.startswith("environment.rubrics.2.rubric:") and "nofile.py" in p for p in problems), problems


def test_a_judge_listed_without_its_config_says_what_to_give(folder):
    with pytest.raises(RubricError, match="'config: {...}' giving at least base_url, model"):
        env_of(folder, rubrics=[{"name": "judge", "rubric": "llm_judge"}])


def test_a_gate_on_a_part_the_sample_lacks_is_an_error_naming_the_parts():
    composite = CompositeRubric(
        [RubricEntry("style", Rubric.bind(lambda completion: {"short": 1.0}))], [RubricGate("style.polite")]
    )
    with pytest.raises(RubricError, match="'style.polite': no such component.*style.short"):
        Rubric.bind(composite).score("x", {}, {}, "row 0")


def test_components_reach_the_trajectories_and_their_means_are_the_step_metrics(folder, chatml_tokenizer):
    manifest = load_manifest(write(folder, rubrics=ENTRIES))
    factory = make_env_factory(manifest.environment, base_dir=manifest.base_dir)
    with RolloutCollector(factory, chatml_tokenizer, batch_size=2, group_size=2, seed=0) as collector:
        batch = collector.collect(ScriptedPolicy(chatml_tokenizer, reply="0"))
    components = [t.info["reward_components"] for t in batch.trajectories]
    assert all(set(c) == {"correct", "style", "style.short", "style.polite", "exact"} for c in components)
    metrics = reward_component_metrics(components)
    right = sum(c["correct"] for c in components) / len(components)  # the row with answer 0, if drawn
    assert metrics["reward/correct"] == pytest.approx(right)
    assert metrics["reward/style.short"] == 1.0 and metrics["reward/style.polite"] == 0.0


def test_a_component_an_episode_lacks_counts_zero_in_the_mean():
    assert reward_component_metrics([{"a": 1.0}, {"b": 2.0}, None]) == {"reward/a": 1 / 3, "reward/b": 2 / 3}
    assert reward_component_metrics([]) == {}


def test_the_progress_line_shows_the_reward_then_its_largest_components(capsys):
    bar = ProgressBar(10, 0, show=False, lines=True)
    bar.update(10, {"train/reward": 0.5, "reward/small": 0.01, "reward/big": -2.0, "reward/mid": 0.3, "reward/tiny": 0.0, "train/loss": 1.0})
    line = capsys.readouterr().err
    assert "reward 0.500  reward/big -2.000  reward/mid 0.300  reward/small 0.010  loss 1.000" in line
    assert "reward/tiny" not in line


def test_the_docs_multi_turn_example_sums_its_components_over_the_turns(chatml_tokenizer):
    import re
    from pathlib import Path

    from agilerl.rollout.harness import RolloutHarness

    text = (Path(__file__).resolve().parents[1] / "docs" / "rubrics.md").read_text()
    namespace: dict = {}
    exec(compile(re.findall(r"```python\n(.*?)```", text, re.S)[-1], "docs/rubrics.md", "exec"), namespace)
    harness = RolloutHarness.local(namespace["Negotiation"](), chatml_tokenizer)
    harness.reset(seed=0)
    assert harness.step("please lower it")[1] == 0.0  # polite, not solved: the gate zeroes polite
    _, reward, done, _, info = harness.step("please, a deal")
    assert done and reward == pytest.approx(1.1) and info["reward_components"] == {"solved": 1.0, "polite": 1.0}
    assert harness.trajectory.info["reward_components"] == {"solved": 1.0, "polite": 2.0}


def test_eval_reports_each_component_in_its_rows_and_summary(folder, capsys, tmp_path):
    import json

    from agilerl.cli.main import main

    manifest = write(folder, "eval.yaml", rubrics=ENTRIES, max_turns=1)
    out = tmp_path / "rows.jsonl"
    code = main(["eval", str(manifest), "--model", "tiny", "--max-new-tokens", "3", "--no-progress",
                 "-n", "2", "-k", "2", "--output", str(out), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    names = {"correct", "style", "style.short", "style.polite", "exact"}
    assert len(rows) == 4 and all(set(r["reward_components"]) == names for r in rows)
    assert summary["reward_components"] == reward_component_metrics(r["reward_components"] for r in rows)
    assert set(summary["reward_components"]) == {f"reward/{n}" for n in names}


def test_async_entries_are_awaited_together_and_an_async_rubric_alone_is_awaited():
    import asyncio

    started: dict[str, asyncio.Event] = {}

    def meeting(name: str, other: str):
        async def rubric(completion):  # finishes only once the other entry has started too
            started.setdefault(name, asyncio.Event()).set()
            await asyncio.wait_for(started.setdefault(other, asyncio.Event()).wait(), timeout=10)
            return 0.5

        return rubric

    composite = CompositeRubric([RubricEntry("a", Rubric.bind(meeting("a", "b"))), RubricEntry("b", Rubric.bind(meeting("b", "a")), 2.0)])
    assert Rubric.bind(composite).score("x", {}, {}, "row 0") == (1.5, {"a": 0.5, "b": 0.5})

    async def alone(completion, answer):
        await asyncio.sleep(0)
        return {"right": float(completion == answer)}

    assert Rubric.bind(alone).score("4", {"answer": "4"}, {}, "row 0") == (1.0, {"right": 1.0})


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ranks_reporting_different_components_average_each_over_the_ranks_that_have_it_and_counts_add_up(tmp_path):
    import json

    from tests.test_train_distributed import _accelerate_launch

    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent(f'''
        import json
        from accelerate import Accelerator
        from agilerl.train.distributed import merge_over_ranks

        accelerator = Accelerator(cpu=True)
        rank = accelerator.process_index
        metrics = {{"train/reward": float(rank), f"reward/only{{rank}}": 1.0 + rank, "reward/both": 2.0 * rank,
                    "rollout/dropped_stale": 1.0 + rank, "rollout/staleness_max": 3.0 * rank}}
        merged = merge_over_ranks(accelerator, metrics)
        (__import__("pathlib").Path({str(tmp_path)!r}) / f"rank{{rank}}.json").write_text(json.dumps(merged))
        accelerator.wait_for_everyone()
        accelerator.end_training()  # the process group is destroyed: no rank exits with gloo's threads running
    '''))
    _accelerate_launch("ddp", [str(script)])
    merged = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert merged[0] == merged[1] == {
        "train/reward": 0.5, "reward/only0": 1.0, "reward/only1": 2.0, "reward/both": 1.0,
        "rollout/dropped_stale": 3.0, "rollout/staleness_max": 3.0,  # a count is the ranks' total, a max their largest
    }


def test_the_docs_manifests_validate():
    import re
    from pathlib import Path

    from agilerl.manifest.spec import parse_env_spec, parse_manifest

    text = (Path(__file__).resolve().parents[1] / "docs" / "rubrics.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    whole = [b for b in blocks if "model" in b]
    assert len(whole) == 1 and [e.name for e in parse_manifest(whole[0]).environment.rubrics] == ["correct", "format", "working"]
    assert len(parse_env_spec(blocks[0]["environment"]).rubric_entries) == 3
