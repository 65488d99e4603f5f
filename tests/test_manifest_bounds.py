"""What a manifest may hold: env_packages are requirement names only (one rule for validate and
install), and no YAML file may expand past a bound."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agilerl.errors import ConfigError, EnvPackagesError
from agilerl.manifest.spec import MAX_MANIFEST_VALUES, parse_env_spec
from agilerl.registry.install import install_packages

NOT_NAMES = {
    "direct reference": ("name @ https://example.invalid/name-1.0.tar.gz", "direct reference"),
    "wheel file": ("evil-1.0-py3-none-any.whl", "names a file"),
    "sdist file": ("x.tar.gz", "names a file"),
    "path": ("../../etc", "not a valid requirement"),
    "shell": ("pkg; rm -rf /", "not a valid requirement"),
    "vcs url": ("git+https://example.invalid/a/b", "not a valid requirement"),
    "option on a second line": ("requests\n--index-url=https://example.invalid", "several lines"),
    "option": ("--index-url=https://example.invalid", "options such as '-e'"),
}


def _manifest(tmp_path: Path, packages: list[str]) -> Path:
    import yaml

    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(
        {"environment": {"env_type": "rollout", "entrypoint": "x:y", "env_packages": {"uv": packages}}}
    ))
    return path


@pytest.mark.parametrize("bad, reason", NOT_NAMES.values(), ids=NOT_NAMES)
def test_env_packages_take_requirement_names_only_at_parse_and_at_install(bad, reason):
    with pytest.raises(ConfigError, match=reason) as info:
        parse_env_spec({"env_type": "rollout", "entrypoint": "x:y", "env_packages": {"uv": ["ok", bad]}})
    assert info.value.errors[0].startswith("environment.env_packages.uv.1: ")
    with pytest.raises(EnvPackagesError, match=reason):
        install_packages([bad])  # refused before uv runs: nothing can be installed


@pytest.mark.parametrize("good", ["gem-llm", "textarena>=0.7", "reasoning-gym[all]==0.1.23; python_version>='3.10'"])
def test_names_extras_specifiers_and_markers_are_accepted(good):
    spec = parse_env_spec({"env_type": "rollout", "entrypoint": "x:y", "env_packages": {"uv": [f" {good} "]}})
    assert spec.env_packages is not None and spec.env_packages.packages == [good]


def _validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agilerl", "manifest", "validate", str(path)],
        capture_output=True, text=True, timeout=120,
    )


def test_manifest_validate_refuses_a_file_name_in_env_packages(tmp_path):
    result = _validate(_manifest(tmp_path, ["evil-1.0-py3-none-any.whl"]))
    assert result.returncode == 2
    assert "environment.env_packages.uv.0: 'evil-1.0-py3-none-any.whl' names a file" in result.stderr


def test_an_alias_bomb_is_refused_with_its_size_not_expanded(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    lines.append("environment: {env_type: rollout, entrypoint: 'x:y', env_config: {big: *a8}}")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert path.stat().st_size < 600
    result = _validate(path)
    assert result.returncode == 2
    assert "expands to 926,177,123 values" in result.stderr
    assert f"at most {MAX_MANIFEST_VALUES:,}" in result.stderr
    assert len(result.stdout) == 0 and len(result.stderr) < 1000


def test_an_alias_that_contains_itself_is_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("environment: &e {env_type: rollout, entrypoint: 'x:y', env_config: {again: *e}}\n")
    result = _validate(path)
    assert result.returncode == 2 and "refers to itself" in result.stderr


def test_ordinary_aliases_still_work(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(
        "x-defaults: &cfg {system_prompt: Reply with one number.}\n"
        "environment: {env_type: rollout, entrypoint: 'json:JSONDecoder', env_config: *cfg}\n"
    )
    result = _validate(path)
    assert result.returncode == 0, result.stderr
    assert "system_prompt: Reply with one number." in result.stdout


SIZES = {
    "batch_size": ("training: {batch_size: 1000000000}", "training.batch_size: 1,000,000,000 is past the bound of 65,536"),
    "group_size": ("training: {group_size: 1000000000}", "training.group_size: 1,000,000,000 is past the bound of 4,096"),
    "product": ("training: {batch_size: 60000, group_size: 4000}",
                "batch_size 60,000 x group_size 4,000 is 240,000,000 rollouts held at once, past the bound of 1,048,576"),
    "async_lanes": ("training: {batch_size: 4, group_size: 4, rollout_mode: async, max_staleness: 1000000000}",
                    "batch_size 4 x group_size 4 x (max_staleness 1,000,000,000 + 1) is 16,000,000,016 rollouts held"),
    "max_new_tokens": ("training: {max_new_tokens: 10000000000}",
                       "training.max_new_tokens: 10,000,000,000 is past the bound of 1,048,576"),
    "eval_episodes": ("training: {eval_episodes: 1000000000}", "training.eval_episodes: 1,000,000,000 is past the bound of"),
}


@pytest.mark.parametrize("training, said", SIZES.values(), ids=SIZES)
def test_sizes_past_any_memory_are_refused_by_validate_and_by_train(tmp_path, training, said):
    """A unit slip (10**9) used to pass validate and end the run with a bare MemoryError."""
    path = tmp_path / "m.yaml"
    path.write_text("environment: {env_type: rollout, entrypoint: guess}\n" + training + "\n")
    result = _validate(path)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    train = subprocess.run([sys.executable, "-m", "agilerl", "train", str(path), "--output-dir", str(tmp_path / "out")],
                           capture_output=True, text=True, timeout=120)
    assert train.returncode == 2 and said in train.stderr and "MemoryError" not in train.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was made


def test_sizes_at_their_bound_are_accepted():
    from agilerl.manifest.settings import MAX_BATCH_SIZE, MAX_NEW_TOKENS, TrainingSettings

    settings = TrainingSettings(batch_size=MAX_BATCH_SIZE, group_size=16, max_new_tokens=MAX_NEW_TOKENS)
    assert settings.batch_size * settings.group_size == 1_048_576
