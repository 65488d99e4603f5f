"""Validation is the contract: every value `manifest validate` passes is one training can use, a
typo'd section is an error, and a user's broken file exits 2 with where it broke."""

from __future__ import annotations

import math

import pytest
import yaml

from agilerl.cli.main import main
from agilerl.errors import ManifestError
from agilerl.manifest.settings import MAX_SEED
from agilerl.manifest.environment import MAX_TURNS
from agilerl.manifest.spec import parse_manifest

ENV = {"env_type": "rollout", "entrypoint": "guess"}

REFUSED = {
    "seed past numpy's and torch's range": ({"training": {"seed": 1_700_000_000_000_000_000}}, "training.seed", "less than or equal to 4294967295"),
    "negative seed": ({"training": {"seed": -1}}, "training.seed", "greater than or equal to 0"),
    "infinite lr": ({"training": {"lr": math.inf}}, "training.lr", "finite number"),
    "nan lr": ({"training": {"lr": math.nan}}, "training.lr", "finite number"),
    "infinite timeout": ({"environment": {**ENV, "request_timeout_s": math.inf}}, "environment.request_timeout_s", "finite number"),
    "bool batch_size": ({"training": {"batch_size": True}}, "training.batch_size", "got the bool 'true'"),
    "bool float": ({"training": {"max_grad_norm": False}}, "training.max_grad_norm", "got the bool 'false'"),
    "bool in a nested section": ({"model": {"lora": {"r": True}}}, "model.lora.r", "got the bool 'true'"),
    "huge turn budget": ({"environment": {**ENV, "max_turns": 1_000_000_000_000}}, "environment.max_turns", f"less than or equal to {MAX_TURNS}"),
    "zero max_reward": ({"environment": {**ENV, "max_reward": 0}}, "environment.max_reward", "greater than 0"),
    "infinite algorithm option": ({"algorithm": {"name": "grpo", "beta": math.inf}}, "algorithm.beta", "finite number"),
    "typo'd section": ({"trainig": {"max_steps": 1}}, "(top level)", "unknown manifest key(s): trainig (did you mean 'training'?)"),
}


@pytest.mark.parametrize("extra, field, message", REFUSED.values(), ids=REFUSED)
def test_validate_refuses_what_training_cannot_use(tmp_path, capsys, extra, field, message):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"environment": ENV, **extra}))
    assert main(["manifest", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.strip().startswith(f"- {field}:"))
    assert message in line


def test_the_edges_of_the_ranges_are_accepted_and_ints_are_ints():
    manifest = parse_manifest(
        {"environment": {**ENV, "max_turns": MAX_TURNS}, "training": {"seed": MAX_SEED, "lr": 1, "batch_size": 4.0},
         "x-shared": {"anchors": "live here"}}
    )
    assert (manifest.training.seed, manifest.training.lr, manifest.environment.max_turns) == (MAX_SEED, 1.0, MAX_TURNS)
    assert type(manifest.training.batch_size) is int


def test_unknown_keys_inside_environment_stay_warnings():
    with pytest.warns(UserWarning, match=r"environment: ignoring unknown key\(s\): colour"):
        parse_manifest({"environment": {**ENV, "colour": "blue"}})


def test_train_refuses_an_out_of_range_seed_override(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"environment": ENV}))
    assert main(["train", str(path), "--seed", str(2**63), "--output-dir", str(tmp_path / "out")]) == 2
    assert "training.seed: Input should be less than or equal to 4294967295" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


BROKEN_RUBRICS = {
    "syntax error": ("def reward(completion:\n    return 1.0\n", "'rubric.py' is not valid Python ({file}, line 1: '(' was never closed"),
    "raises when run": ("raise NameError('nme')\n", "'rubric.py': running {file} raised NameError: nme; fix the file."),
}


@pytest.mark.parametrize("command", ["validate", "train"])
@pytest.mark.parametrize("source, message", BROKEN_RUBRICS.values(), ids=BROKEN_RUBRICS)
def test_a_broken_rubric_file_exits_2_and_says_where(tmp_path, capsys, command, source, message):
    (tmp_path / "rubric.py").write_text(source)
    (tmp_path / "data.csv").write_text("question,answer\nq,a\nr,b\n")
    manifest = tmp_path / "m.yaml"
    manifest.write_text(yaml.safe_dump({
        "environment": {"env_type": "rollout", "dataset": "data.csv", "rubric_file_path": "rubric.py", "rubric_name": "reward"},
        "training": {"max_steps": 1},
    }))
    args = ["manifest", "validate", str(manifest)] if command == "validate" else [
        "train", str(manifest), "--output-dir", str(tmp_path / "out"), "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message.format(file=tmp_path / "rubric.py") in err


def test_parse_errors_name_every_field_at_once():
    with pytest.raises(ManifestError) as info:
        parse_manifest({"environment": ENV, "training": {"seed": -1, "lr": math.nan, "batch_size": True}})
    assert sorted(e.split(":")[0] for e in info.value.errors) == ["training.batch_size", "training.lr", "training.seed"]


def test_the_schema_refuses_unknown_sections_too():
    from agilerl.manifest.spec import Manifest

    schema = Manifest.model_json_schema()
    assert schema["additionalProperties"] is False and schema["patternProperties"] == {"^x-": {}}
