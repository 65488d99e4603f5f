"""Every manifest rule, with the exact error a user sees."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from agilerl.errors import ConfigError, ManifestError, ManifestWarning
from agilerl.manifest.environment import (
    ENVIRONMENT_VARIANTS,
    AgentSpec,
    DatasetSpec,
    EntrypointSpec,
    EnvironmentSpec,
    EnvUrlSpec,
    RolloutSpec,
    ScoredDatasetSpec,
)
from agilerl.manifest.spec import load_manifest, parse_env_spec

ROLLOUT = {"env_type": "rollout", "entrypoint": "guess_env.py:GuessEnv"}
REMOTE = {"env_type": "rollout", "env_url": "http://h:1"}
SCORED = {"env_type": "rollout", "dataset": "d.parquet", "rubric_name": "exact_match"}
SFT = {"env_type": "dataset", "dataset": "x.jsonl", "objective": "sft"}


def _error(data) -> str:
    with pytest.raises(ConfigError) as info:
        parse_env_spec(data)
    return "\n".join(info.value.errors)


def test_defaults_and_aliases():
    spec = parse_env_spec(
        {"env_type": "rollout", "name": "data.parquet", "reward_file_path": "r.py", "reward_fn_name": "score"}
    )
    assert isinstance(spec, ScoredDatasetSpec) and spec.dataset == "data.parquet"
    assert spec.rubric_file_path == "r.py" and spec.rubric_name == "score"
    assert spec.train_test_split == 0.9 and spec.request_timeout_s == 300
    assert spec.chat_template_kwargs == {} and spec.env_config == {} and spec.max_turns is None
    assert parse_env_spec(SFT).response_column == "response"


@pytest.mark.parametrize("base", [EnvironmentSpec, RolloutSpec])
def test_a_base_without_a_source_cannot_be_built(base):
    with pytest.raises(TypeError, match="validate a mapping with parse_env_spec"):
        base(env_type="rollout")


def test_each_source_carries_its_own_action_field_default():
    """A remote client writes "message" unless told; an OpenEnv adapter finds the field itself."""
    assert parse_env_spec(REMOTE).action_field == "message"
    assert parse_env_spec(ROLLOUT).action_field is None


YAML_VARIANTS = {
    "entrypoint": ("entrypoint: guess\nenv_config: {low: 1}\nmax_turns: 3\n", EntrypointSpec),
    "env_url": ("env_url: [ws://a:1, ws://b:1]\nmcp_tool: play\n", EnvUrlSpec),
    "scored dataset": ("dataset: d.csv\nreward_fn_name: exact_match\nmax_reward: 2\n", ScoredDatasetSpec),
    "dataset": ("name: d.jsonl\nobjective: preference\ntrain_test_split: 0.8\n", DatasetSpec),
    "agent": ("agent_command: [python, agent.py]\ndataset: tasks.jsonl\nfailure_score: null\nmax_turns: 8\n", AgentSpec),
}


@pytest.mark.parametrize(("body", "variant"), YAML_VARIANTS.values(), ids=YAML_VARIANTS)
def test_each_variant_reads_from_flat_yaml_and_round_trips(tmp_path, body, variant):
    env_type = "dataset" if variant is DatasetSpec else "rollout"
    path = tmp_path / "m.yaml"
    path.write_text("environment:\n" + "".join(f"  {line}\n" for line in f"env_type: {env_type}\n{body}".splitlines()))
    spec = load_manifest(path).environment
    assert type(spec) is variant
    again = parse_env_spec(spec.model_dump(by_alias=True, exclude_unset=True))
    assert again == spec and type(again) is variant


REFUSED = {
    "a table key on an agent without tasks": ({"env_type": "rollout", "agent": "a.py:f", "columns": {"q": "question"}},
                                              "'columns' applies to an agent's task table; add 'dataset:' (the tasks) or remove it"),
    "an env's key on an agent": ({"env_type": "rollout", "agent_command": ["python", "a.py"], "observation_field": "x"},
                                 "'observation_field' applies to an 'entrypoint' env or a remote env ('env_url'); remove it for an agent program"),
    "an agent's key on an env": ({**ROLLOUT, "episode_timeout_s": 5}, "'episode_timeout_s' applies to an agent program ('agent_command' or 'agent'); remove it for an 'entrypoint' env"),
    "objective on a rollout": ({**ROLLOUT, "objective": "sft"}, "'objective' applies to env_type 'dataset' only"),
    "env_config on env_url": ({**REMOTE, "env_config": {"system_prompt": "x"}}, "'env_config' does not reach a remote env"),
    "env_packages on env_url": ({**REMOTE, "env_packages": {"uv": ["a"]}}, "'env_packages' applies only with 'entrypoint'"),
    "env_packages on a dataset": ({**SCORED, "env_packages": {"uv": ["a"]}}, "'env_packages' applies only with 'entrypoint'"),
    "action_type on env_url": ({**REMOTE, "action_type": "m:A"}, "'action_type' applies only with an OpenEnv 'entrypoint'"),
    "action_type on a dataset": ({**SFT, "action_type": "m:A"}, "'action_type' applies only with an OpenEnv 'entrypoint'"),
    "mcp_tool on a dataset rollout": ({**SCORED, "mcp_tool": "play"}, "'mcp_tool' applies only with 'env_url' or an OpenEnv MCP 'entrypoint'"),
    "rubric on an entrypoint": ({**ROLLOUT, "rubric_name": "r"}, "'rubric_name' applies to a dataset rollout ('dataset' with a rubric); remove it for an 'entrypoint' env"),
    "a rubric's alias on env_url": ({**REMOTE, "reward_fn_name": "r"}, "'reward_fn_name' applies to a dataset rollout"),
    "train_test_split on env_url": ({**REMOTE, "train_test_split": 0.5}, "'train_test_split' applies to a dataset rollout ('dataset' with a rubric) or env_type 'dataset' or an agent program ('agent_command' or 'agent'); remove it for a remote env"),
    "max_turns on SFT data": ({**SFT, "max_turns": 2}, "'max_turns' applies to an 'entrypoint' env or a remote env ('env_url') or a dataset rollout"),
    "reconnect_timeout_s in process": ({**ROLLOUT, "reconnect_timeout_s": 5}, "'reconnect_timeout_s' applies to a remote env ('env_url'); remove it for an 'entrypoint' env"),
    "response_column on a rollout": ({**SCORED, "response_column": "y"}, "'response_column' applies to env_type 'dataset'; remove it for a dataset rollout"),
    "no dataset for SFT": ({"env_type": "dataset", "objective": "sft"}, "env_type 'dataset' requires 'dataset'"),
    "an empty dataset name": ({**SCORED, "dataset": ""}, "environment.dataset: String should have at least 1 character"),
}


@pytest.mark.parametrize(("data", "message"), REFUSED.values(), ids=REFUSED)
def test_what_no_variant_takes_is_refused_naming_the_field(data, message):
    assert message in _error(data)


def test_env_type_is_required_and_the_error_names_the_line_to_add():
    assert "environment: 'env_type' is required: add 'env_type: rollout'" in _error({"entrypoint": "a:b"})
    assert "add 'env_type: dataset'" in _error({"dataset": "d.jsonl", "objective": "sft"})


@pytest.mark.parametrize(
    ("old", "replacement"),
    [
        ("multiturn", "use 'env_type: rollout'"),
        ("reasoning", "use 'env_type: rollout' with 'max_turns: 1'"),
        ("sft", "use 'env_type: dataset' with 'objective: sft'"),
        ("preference", "use 'env_type: dataset' with 'objective: preference'"),
    ],
)
def test_retired_env_types_name_their_replacement(old, replacement):
    assert f"environment: env_type '{old}' is retired: {replacement}." in _error(
        {**ROLLOUT, "env_type": old}
    )


def test_dataset_requires_objective():
    assert "env_type 'dataset' requires 'objective: sft' or 'objective: preference'" in _error(
        {"env_type": "dataset", "dataset": "x.jsonl"}
    )
    spec = parse_env_spec({"env_type": "dataset", "dataset": "x.jsonl", "objective": "sft"})
    assert spec.objective == "sft"


def test_objective_only_for_dataset():
    assert "'objective' applies to env_type 'dataset' only" in _error({**ROLLOUT, "objective": "sft"})


@pytest.mark.parametrize(
    ("sources", "got"),
    [
        ({}, "none"),
        ({"entrypoint": "a:b", "env_url": "http://127.0.0.1:1", "max_turns": 2}, "entrypoint, env_url"),
        ({"entrypoint": "a:b", "dataset": "d.parquet", "rubric_name": "r"}, "dataset, entrypoint"),
        ({"agent": "a.py:f", "agent_command": ["python", "a.py"]}, "agent, agent_command"),
        ({"agent_command": ["python", "a.py"], "entrypoint": "a:b"}, "agent_command, entrypoint"),
    ],
)
def test_rollout_names_exactly_one_source(sources, got):
    assert (
        "a rollout names exactly one source: 'dataset' (with a rubric), 'entrypoint', 'env_url', or an "
        f"agent program ('agent_command' or 'agent') (got: {got})"
    ) in _error(
        {"env_type": "rollout", **sources}
    )


def test_dataset_rollout_needs_a_rubric():
    assert "a dataset rollout needs 'rubric_name'" in _error({"env_type": "rollout", "dataset": "d.parquet"})


def test_env_url_takes_one_url_or_replicas_and_an_optional_max_turns():
    spec = parse_env_spec({"env_type": "rollout", "env_url": ["http://a:1", "http://b:1"], "max_turns": 3})
    assert spec.env_urls == ["http://a:1", "http://b:1"]
    assert parse_env_spec({"env_type": "rollout", "env_url": "http://h:1"}).max_turns is None  # from /metadata


def test_env_config_does_not_go_with_env_url():
    error = _error({"env_type": "rollout", "env_url": "http://h:1", "env_config": {"system_prompt": "x"}})
    assert "'env_config' does not reach a remote env" in error and "--env-config" in error


def test_env_packages_only_with_an_entrypoint():
    error = _error({"env_type": "rollout", "env_url": "http://h:1", "env_packages": {"uv": ["agilerl-env-gem"]}})
    assert "'env_packages' applies only with 'entrypoint'" in error


def test_mcp_tool_only_with_env_url_or_an_openenv_entrypoint():
    dataset = {"env_type": "rollout", "dataset": "d.parquet", "rubric_name": "exact_match"}
    assert "'mcp_tool' applies only with 'env_url' or an OpenEnv MCP 'entrypoint'" in _error(
        {**dataset, "mcp_tool": "play"}
    )
    from agilerl.errors import InvalidArgument
    from agilerl.assembly.env_factory import make_env_factory

    spec = parse_env_spec({"env_type": "rollout", "entrypoint": "json:JSONDecoder", "mcp_tool": "play"})
    with pytest.raises(InvalidArgument, match="mcp_tool set for 'json:JSONDecoder', which is not an OpenEnv"):
        make_env_factory(spec)


def test_observation_field_and_processor_exclude_each_other():
    assert "'observation_field' and 'observation_processor' exclude each other" in _error(
        {**ROLLOUT, "observation_field": "a.b", "observation_processor": "m:f"}
    )


def test_max_turns_at_least_one():
    assert "environment.max_turns: Input should be greater than or equal to 1 (got 0)" in _error(
        {**ROLLOUT, "max_turns": 0}
    )


@pytest.mark.parametrize("split", [0, 1, 1.5, -0.1])
def test_train_test_split_in_open_interval(split):
    assert "environment.train_test_split: Input should be" in _error({**SCORED, "train_test_split": split})


def test_request_timeout_non_negative_and_zero_disables():
    assert "environment.request_timeout_s: Input should be greater than or equal to 0 (got -1)" in _error(
        {**ROLLOUT, "request_timeout_s": -1}
    )
    assert parse_env_spec({**ROLLOUT, "request_timeout_s": 0}).request_timeout_s == 0


@pytest.mark.parametrize("bad", ["-e", "--index-url", " -r"])
def test_env_packages_rejects_options_at_parse_time(bad):
    assert f"env_packages.uv.1: {bad!r} is an option, not a package name" in _error(
        {**ROLLOUT, "env_packages": {"uv": ["good", bad]}}
    )


def test_env_packages_takes_uv_or_pip():
    assert parse_env_spec({**ROLLOUT, "env_packages": {"pip": ["a>=1"]}}).env_packages.packages == ["a>=1"]
    assert "exactly one of 'uv: [...]' or 'pip: [...]'" in _error(
        {**ROLLOUT, "env_packages": {"uv": ["a"], "pip": ["b"]}}
    )
    assert "environment.env_packages.conda: Extra inputs are not permitted" in _error(
        {**ROLLOUT, "env_packages": {"conda": ["a"]}}
    )


def test_unknown_keys_are_ignored_with_one_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = parse_env_spec({**ROLLOUT, "colour": "red", "flavour": 1})
    messages = [str(w.message) for w in caught if issubclass(w.category, ManifestWarning)]
    assert messages == ["environment: ignoring unknown key(s): colour, flavour"]
    assert not hasattr(spec, "colour")


def test_errors_are_all_reported_with_field_paths(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("environment:\n  env_type: rollout\n  dataset: d.csv\n  rubric_name: r\n  max_turns: 0\n  train_test_split: 2\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert len(info.value.errors) == 2
    assert str(path) in str(info.value)


def test_manifest_folder_is_the_base_dir(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "m.yaml"
    path.write_text("environment: {env_type: rollout, entrypoint: 'env.py:Env'}\n")
    assert load_manifest(path).base_dir == (tmp_path / "sub").resolve()


def _cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "agilerl", *args], capture_output=True, text=True, cwd=cwd, timeout=60
    )


def test_cli_validate_stale_manifest_prints_replacement_and_exits_2(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("environment:\n  env_type: reasoning\n  entrypoint: a:b\n")
    result = _cli("manifest", "validate", str(path))
    assert result.returncode == 2
    assert "environment: env_type 'reasoning' is retired: use 'env_type: rollout' with 'max_turns: 1'." in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_validate_prints_the_normalised_spec(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("environment:\n  env_type: rollout\n  entrypoint: a:b\n")
    result = _cli("manifest", "validate", str(path))
    assert result.returncode == 2  # module 'a' exists nowhere: train would fail
    assert "environment.entrypoint: cannot import module 'a'" in result.stderr
    path.write_text("environment:\n  env_type: rollout\n  dataset: org/qa\n  reward_fn_name: r\n")
    result = _cli("manifest", "validate", str(path))
    assert result.returncode == 2 and "environment.rubric_name: no rubric named 'r' is registered" in result.stderr
    path.write_text("environment:\n  env_type: rollout\n  dataset: org/qa\n  reward_fn_name: exact_match\n")
    result = _cli("manifest", "validate", str(path))
    assert result.returncode == 0, result.stderr
    assert "rubric_name: exact_match" in result.stdout and "train_test_split: 0.9" in result.stdout


def test_cli_validate_missing_file_exits_2(tmp_path):
    result = _cli("manifest", "validate", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2 and "cannot read" in result.stderr and "Traceback" not in result.stderr


def test_cli_schema_shows_every_variant_with_its_fields():
    import json


    schema = json.loads(_cli("manifest", "schema").stdout)
    variants = schema["properties"]["environment"]["oneOf"]
    assert [v["$ref"].rsplit("/", 1)[1] for v in variants] == [v.__name__ for v in ENVIRONMENT_VARIANTS]
    for variant in ENVIRONMENT_VARIANTS:
        assert set(schema["$defs"][variant.__name__]["properties"]) == set(variant.model_fields)
    assert schema["$defs"]["ScoredDatasetSpec"]["properties"]["train_test_split"]["default"] == 0.9
    assert "env_config" not in schema["$defs"]["EnvUrlSpec"]["properties"]


def test_the_docs_table_marks_exactly_the_fields_of_each_variant():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "manifest.md").read_text()
    rows = re.findall(r"^\| `(\w+)`[^|]*\|((?: *x? *\|){5})", text, flags=re.MULTILINE)
    for column, variant in enumerate(ENVIRONMENT_VARIANTS):
        marked = {key for key, marks in rows if marks.split("|")[column].strip() == "x"}
        assert marked == set(variant.model_fields), variant.__name__
