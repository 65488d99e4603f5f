"""QADatasetEnv from real manifests, Parquet files and reward files: templates, splits, rubrics."""

from __future__ import annotations

import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from agilerl.assembly.datasets import qa_env_factory
from agilerl.data.qa_dataset import QADatasetEnv
from agilerl.errors import (
    DatasetLoadError,
    EpisodeError,
    InvalidArgument,
    ManifestError,
    RubricError,
    TemplateError,
)
from agilerl.data.templates import PromptTemplate
from agilerl.manifest.spec import load_manifest

N_ROWS = 20
REWARD_PY = textwrap.dedent(
    '''
    def reversed_order(answer, completion):
        return float(completion.strip() == str(answer))

    def parts(completion, row):
        return {"format": 0.5, "correct": float(completion == str(row["answer"]))}

    seen = []

    def everything(**kwargs):
        seen.append(kwargs)
        return 1

    def boom(completion):
        raise KeyError("no such thing")

    def chatty(completion):
        return "yes"

    def needs_tokenizer(completion, tokenizer):
        return 0.0

    def wants_label(completion, label):
        return 0.0

    def needs_question(completion, question):
        return 0.0
    '''
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qa")
    nums = [[i, i + 1, i + 2] for i in range(N_ROWS)]
    pq.write_table(pa.table({"nums": nums, "target": [3 * i + 3 for i in range(N_ROWS)]}), folder / "tasks.parquet")
    (folder / "reward.py").write_text(REWARD_PY)
    return folder


def make_spec(folder, name="manifest.yaml", **environment):
    env = {
        "env_type": "rollout",
        "dataset": "tasks.parquet",
        "columns": {"nums": "question", "target": "answer"},
        "prompt_template": {"system_0": "You play countdown.", "user_1": "Use {question} to make {answer}."},
        "rubric_file_path": "reward.py",
        "rubric_name": "reversed_order",
        "train_test_split": 0.75,
    }
    env.update(environment)
    env = {k: v for k, v in env.items() if v is not None}
    path = folder / name
    path.write_text(yaml.safe_dump({"environment": env}))
    manifest = load_manifest(path)
    return manifest.environment, manifest.base_dir


def make_env(folder, **environment) -> QADatasetEnv:
    spec, base_dir = make_spec(folder, **environment)
    return QADatasetEnv.from_spec(spec, base_dir=base_dir)


def test_template_renders_renamed_columns_through_a_real_chat_template(folder, chatml_tokenizer):
    env = make_env(folder)
    prompt, info = env.reset(row_index=0)
    row = env.data.splits.train[0]
    assert prompt == f"Use {row['question']} to make {row['answer']}."
    rendered = chatml_tokenizer.apply_chat_template(
        info["messages"], tokenize=False, add_generation_prompt=True
    )
    assert rendered == (
        "<|im_start|>system\nYou play countdown.<|im_end|>\n"
        f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_harness_renders_the_env_messages(folder, chatml_tokenizer):
    from agilerl.rollout.harness import RolloutHarness

    spec, base_dir = make_spec(folder)
    harness = RolloutHarness.from_spec(spec, chatml_tokenizer, base_dir=base_dir)
    prompt_ids, info = harness.reset(row_index=2)
    assert chatml_tokenizer.decode(list(prompt_ids)).startswith("<|im_start|>system\nYou play countdown.")
    _, reward, terminated, _, _ = harness.step(str(harness.client.env.data.splits.train[2]["answer"]))
    assert (reward, terminated) == (1.0, True)


def test_split_sizes_and_held_out_rows(folder):
    env = make_env(folder)
    assert (env.dataset_size, env.eval_dataset_size) == (15, 5)
    train = {env.reset(row_index=i)[0] for i in range(env.dataset_size)}
    held_out = {env.reset(row_index=i, evaluation=True)[0] for i in range(env.eval_dataset_size)}
    assert len(train) == 15 and len(held_out) == 5 and not train & held_out
    assert env.reset(row_index=1, evaluation=True)[1]["split"] == "test"
    again = make_env(folder, name="again.yaml")
    assert {again.reset(row_index=i, evaluation=True)[0] for i in range(5)} == held_out


def test_split_seed_changes_the_held_out_rows(folder):
    held_out = {make_env(folder).reset(row_index=i, evaluation=True)[0] for i in range(5)}
    other = make_env(folder, env_config={"split_seed": 1})
    assert {other.reset(row_index=i, evaluation=True)[0] for i in range(5)} != held_out


def test_episode_is_reproducible_from_seed_and_row(folder):
    first, second = make_env(folder), make_env(folder)
    assert first.reset(seed=7) == second.reset(seed=7)
    assert first.reset(seed=7, evaluation=True) == second.reset(seed=7, evaluation=True)
    drawn = {first.reset(seed=s)[1]["row_index"] for s in range(30)}
    assert len(drawn) > 5
    prompt, info = first.reset(seed=123, row_index=4)
    assert (prompt, info) == second.reset(seed=999, row_index=4)
    assert first.step("wrong")[1] == second.step("wrong")[1] == 0.0


def test_row_index_out_of_range(folder):
    env = make_env(folder)
    with pytest.raises(InvalidArgument, match=r"row_index 15 is out of range: the train split has 15 rows \(0..14\)"):
        env.reset(row_index=15)
    with pytest.raises(InvalidArgument, match="the test split has 5 rows"):
        env.reset(row_index=5, evaluation=True)


def test_rubric_is_called_by_keyword_and_scores_once(folder):
    env = make_env(folder)
    env.reset(row_index=3)
    answer = str(env.data.splits.train[3]["answer"])
    _, reward, terminated, truncated, info = env.step(f" {answer} ")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info == {"row_index": 3, "split": "train"}
    with pytest.raises(EpisodeError, match="call reset"):
        env.step(answer)


def test_rubric_taking_kwargs_gets_all_five(folder):
    env = make_env(folder, rubric_name="everything", max_reward=2)
    prompt, _ = env.reset(row_index=0)
    _, reward, _, _, info = env.step("hi")
    from agilerl.registry import load_object

    call = load_object("reward.py:seen", folder)[-1]  # the same module the env loaded
    assert set(call) == {"completion", "answer", "question", "row", "info"}
    assert call["completion"] == "hi" and call["row"]["answer"] == call["answer"]
    assert call["info"]["messages"][-1]["content"] == prompt
    assert (reward, info["accuracy"]) == (1.0, 0.5)


def test_component_rewards_are_summed_and_reported(folder):
    env = make_env(folder, rubric_name="parts", max_reward=1.5)
    env.reset(row_index=1)
    _, reward, _, _, info = env.step(str(env.data.splits.train[1]["answer"]))
    assert reward == 1.5
    assert info["reward_components"] == {"format": 0.5, "correct": 1.0}
    assert info["accuracy"] == 1.0


def test_registered_rubric_by_name(folder):
    env = make_env(folder, rubric_file_path=None, rubric_name="numeric_match")
    env.reset(row_index=0)
    answer = env.data.splits.train[0]["answer"]
    assert env.step(f"<answer>{answer}.0</answer>")[1] == 1.0


def test_system_prompt_from_env_config(folder):
    env = make_env(folder, prompt_template={"user_0": "{question}"}, env_config={"system_prompt": "Be brief."})
    _, info = env.reset(row_index=0)
    assert [m["role"] for m in info["messages"]] == ["system", "user"]
    assert info["messages"][0]["content"] == "Be brief."


def test_envs_from_one_factory_share_the_loaded_table(folder):
    spec, base_dir = make_spec(folder)
    factory = qa_env_factory(spec, base_dir=base_dir)
    first, second = factory(), factory()
    assert first is not second and first.data is second.data
    first.reset(row_index=0)
    second.reset(row_index=1)
    assert (first.step("x")[4]["row_index"], second.step("y")[4]["row_index"]) == (0, 1)


def test_default_template_needs_a_question_column(folder):
    with pytest.raises(TemplateError, match=r"the default prompt \(no prompt_template\) uses \{question\} .*columns are: nums, answer"):
        make_env(folder, columns={"target": "answer"}, prompt_template=None)
    env = make_env(folder, prompt_template=None)
    assert env.reset(row_index=0)[1]["messages"] == [{"role": "user", "content": str(env.data.splits.train[0]["question"])}]


@pytest.mark.parametrize(
    ("environment", "error", "message"),
    [
        (
            {"prompt_template": {"user_0": "Reach {goal}"}},
            TemplateError,
            r"uses \{goal\} but the dataset has no such column; its columns are: question, answer",
        ),
        ({"rubric_name": "boom"}, None, None),
        ({"rubric_name": "needs_tokenizer"}, RubricError, r"requires parameter 'tokenizer'"),
        ({"rubric_name": "wants_label"}, RubricError, r"requires parameter 'label'"),
        (
            {"rubric_name": "needs_question", "columns": {"target": "answer"}, "prompt_template": {"user_0": "{nums}"}},
            RubricError,
            r"takes 'question' but the dataset has no 'question' column; its columns are: nums, answer",
        ),
        ({"rubric_name": "missing_fn"}, Exception, r"has no attribute 'missing_fn'"),
        ({"rubric_file_path": "nope.py"}, Exception, r"file not found: .*nope\.py"),
        ({"rubric_file_path": None, "rubric_name": "no_such_rubric"}, Exception, r"no_such_rubric"),
        ({"env_config": {"temperature": 1}}, DatasetLoadError, r"env_config: temperature not understood"),
        ({"columns": {"numbers": "question"}}, DatasetLoadError, r"'numbers' not in dataset"),
        ({"max_reward": -1}, ManifestError, r"environment\.max_reward: Input should be greater than 0"),
    ],
)
def test_load_errors_name_the_problem(folder, environment, error, message):
    if error is None:
        make_env(folder, **environment)  # a raising rubric loads fine; it fails when called
        return
    with pytest.raises(error, match=message):
        make_env(folder, **environment)


def test_raising_rubric_names_the_row(folder):
    env = make_env(folder, rubric_name="boom")
    env.reset(row_index=4, evaluation=True)
    with pytest.raises(RubricError, match=r"rubric 'reward.py:boom' raised KeyError: 'no such thing' \(on test row 4\)"):
        env.step("x")


def test_non_number_reward_names_the_row(folder):
    env = make_env(folder, rubric_name="chatty")
    env.reset(row_index=6)
    with pytest.raises(RubricError, match=r"returned result 'yes' \(str\) on train row 6; return a float"):
        env.step("x")


def test_component_that_is_not_a_number(folder):
    from agilerl.data.rubric import Rubric

    rubric = Rubric.bind(lambda completion: {"a": 1.0, "b": None}, name="bad")
    with pytest.raises(RubricError, match=r"component 'b' None"):
        rubric.score("x", {}, {}, "train row 0")
    with pytest.raises(RubricError, match="NaN"):
        Rubric.bind(lambda completion: float("nan"), name="nan").score("x", {}, {}, "train row 0")


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ({"human_0": "{q}"}, r"key 'human_0' is not '<role>_<index>'"),
        ({"system_1": "a", "user_1": "b"}, r"share index 1"),
        ({"user_0": "{q}", "assistant_1": "Sure:"}, r"last piece .* must be a 'user_<n>' piece"),
        ({"user_0": "{q.__class__}"}, r"must be a plain column name"),
        ({"user_0": "{q"}, r"write literal braces as"),
        ({}, r"prompt_template is empty"),
    ],
)
def test_template_errors(template, message):
    with pytest.raises(TemplateError, match=message):
        PromptTemplate.parse(template)


def test_template_orders_pieces_by_index_and_keeps_literal_braces():
    template = PromptTemplate.parse({"user_10": "{q} {{x}}", "system_2": "sys", "assistant_5": "a", "user_3": "b"})
    assert template.render({"q": "Q"}) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "Q {x}"},
    ]
