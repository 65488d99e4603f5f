"""Entrypoints from a manifest: module:attr, file.py:attr, env_config, system_prompt, max_turns."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agilerl.assembly.env_factory import make_env_factory
from agilerl.envs.client import InProcessEnvClient
from agilerl.errors import LoadError, ModuleNotImportable
from agilerl.rollout.harness import RolloutHarness
from agilerl.manifest.spec import load_manifest, parse_env_spec
from agilerl.registry import load_object

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_docs_guess_env_runs_through_a_manifest(chatml_tokenizer):
    manifest = load_manifest(EXAMPLES / "guess" / "manifest.yaml")
    harness = RolloutHarness.from_spec(manifest.environment, chatml_tokenizer, base_dir=manifest.base_dir)
    assert harness.max_turns == 3
    prompt, _ = harness.reset(seed=0)
    text = chatml_tokenizer.decode(list(prompt))
    assert text.startswith("<|im_start|>system\nReply with one number.<|im_end|>")
    assert "Guess a number between 1 and 10." in text
    target = harness.client.env.target
    *_, terminated, _, _ = harness.step(str(target))
    assert terminated and harness.trajectory.rewards == [1.0]


def test_file_entrypoint_is_relative_to_the_manifest_folder(tmp_path, chatml_tokenizer):
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "echo.py").write_text(
        textwrap.dedent(
            """
            class Echo:
                max_turns = 4
                def __init__(self, greeting="hi"):
                    self.greeting = greeting
                def reset(self, seed=None):
                    return self.greeting, {}
                def step(self, action):
                    return action, 0.5, False, False, {}
            """
        )
    )
    manifest_path = tmp_path / "m.yaml"
    manifest_path.write_text(
        "environment:\n  env_type: rollout\n  entrypoint: envs/echo.py:Echo\n  env_config: {greeting: hello}\n"
    )
    manifest = load_manifest(manifest_path)
    factory = make_env_factory(manifest.environment, base_dir=manifest.base_dir)
    env = factory()
    assert env.reset()[0] == "hello"
    assert factory() is not env  # a fresh env per call
    assert InProcessEnvClient(env).describe().max_turns == 4  # no max_turns in the manifest: the env's


def test_module_entrypoint_and_system_prompt_popped():
    spec = parse_env_spec(
        {
            "env_type": "rollout",
            "entrypoint": "collections:OrderedDict",
            "env_config": {"a": 1, "system_prompt": "be nice"},
        }
    )
    env = make_env_factory(spec)()
    assert dict(env) == {"a": 1}  # system_prompt was not passed as a keyword
    assert env.system_prompt == "be nice"


def test_missing_max_turns_is_a_clear_error(tmp_path, chatml_tokenizer):
    (tmp_path / "nobudget.py").write_text("class Env:\n    pass\n")
    spec = parse_env_spec({"env_type": "rollout", "entrypoint": "nobudget.py:Env"})
    with pytest.raises(Exception, match="Env declares no usable max_turns.*Set environment.max_turns in the manifest"):
        RolloutHarness.from_spec(spec, chatml_tokenizer, base_dir=tmp_path)


def test_module_not_importable_mentions_env_packages():
    with pytest.raises(ModuleNotImportable, match="env_packages") as info:
        load_object("agilerl_no_such_module_xyz:Env")
    assert info.value.module == "agilerl_no_such_module_xyz"


def test_missing_attribute_lists_what_the_module_has(tmp_path):
    (tmp_path / "envs.py").write_text("class Alpha: ...\nclass Beta: ...\n")
    with pytest.raises(LoadError, match=r"has no attribute 'Gamma'. It has: Alpha, Beta"):
        load_object("envs.py:Gamma", tmp_path)


def test_file_not_found_names_the_path_tried(tmp_path):
    with pytest.raises(LoadError, match=f"file not found: {tmp_path / 'missing.py'}"):
        load_object("missing.py:Env", tmp_path)


def test_env_check_cli_scripted_json():
    result = subprocess.run(
        [sys.executable, "-m", "agilerl", "env", "check", "guess",
         "--env-config", '{"target": 4}', "--actions", "5,2,4", "--episodes", "2", "--json"],
        capture_output=True, text=True, cwd=EXAMPLES / "guess", timeout=120,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["episodes"] == 2 and summary["turns"] == [3, 3]
    assert summary["rewards"] == [1.0, 1.0] and summary["terminated"] == 2 and summary["problems"] == []


def test_env_check_cli_on_a_manifest_prints_the_transcript():
    command = [sys.executable, "-m", "agilerl", "env", "check", str(EXAMPLES / "guess" / "manifest.yaml"),
               "--actions", "11,12,13"]
    plain = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    assert "[system] Reply with one number.\n[user] " in plain.stdout
    assert "[assistant] 11\n[user] Too high!" in plain.stdout and "truncated=True" in plain.stdout
    templated = subprocess.run([*command, "--tokenizer", "tiny"], capture_output=True, text=True, timeout=120)
    assert templated.returncode == 0, templated.stderr
    assert "<|im_start|>system\nReply with one number.<|im_end|>" in templated.stdout
    assert "Too high!" in templated.stdout and "truncated=True" in templated.stdout


def test_env_check_cli_reports_a_broken_env(tmp_path):
    (tmp_path / "bad.py").write_text(
        "class Bad:\n    def reset(self, seed=None):\n        return 'p'\n    def step(self, a):\n        return 'o', 1\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "agilerl", "env", "check", "bad.py:Bad", "--json"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert result.returncode == 1
    assert json.loads(result.stdout)["problems"] == ["reset() must return a 2-tuple (prompt, info), got str"]


def test_env_config_must_be_a_json_object():
    result = subprocess.run(
        [sys.executable, "-m", "agilerl", "env", "check", "guess", "--env-config", "[1]"],
        capture_output=True, text=True, cwd=EXAMPLES / "guess", timeout=60,
    )
    assert result.returncode == 2 and "--env-config: must be a JSON object" in result.stderr
