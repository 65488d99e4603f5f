"""NaN and infinity are refused before the first step: anywhere in a manifest (typed or not: a
judge's config, the algorithm's options) at load time, naming the key, and in a rubric entry's
score at run time, naming the entry (inf beside -inf used to end in "-inf + inf in fsum")."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from agilerl.assembly.env_factory import make_env_factory
from agilerl.errors import ConfigError, ManifestError, RubricError
from agilerl.manifest.spec import load_manifest, parse_env_spec

JUDGE = {"base_url": "http://127.0.0.1:9/v1", "model": "judge"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("finite")
    pq.write_table(pa.table({"question": ["1+1?", "2+2?"], "answer": ["2", "4"]}), folder / "qa.parquet")
    (folder / "reward.py").write_text(textwrap.dedent(
        """
        def up(completion):
            return float("inf")

        def down(completion):
            return float("-inf")

        def huge(completion):
            return {"ok": 1.0, "big": 10 ** 400}

        def fine(completion):
            return 1.0
        """
    ))
    return folder


def _environment(rubrics: list[dict]) -> dict:
    return {"env_type": "rollout", "dataset": "qa.parquet", "train_test_split": 0.5, "rubrics": rubrics}


def test_manifest_validate_names_every_non_finite_key(folder) -> None:
    text = yaml.safe_dump({
        "environment": _environment([{"name": "judged", "rubric": "llm_judge", "config": {
            **JUDGE, "labels": {"correct": 1.0, "wrong": 0.0}, "score_range": [0, 1], "timeout_s": 5,
        }}]),
        "algorithm": {"name": "grpo"},
    })
    text = (text.replace("correct: 1.0", "correct: .nan").replace("- 1\n", "- .nan\n")
            .replace("timeout_s: 5", "timeout_s: .NaN\n      failure_score: .nan")
            .replace("name: grpo", "name: grpo\n  clip_epsilon: .inf"))
    (folder / "nan.yaml").write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "agilerl", "manifest", "validate", str(folder / "nan.yaml")],
        capture_output=True, text=True, timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    for path, value in [
        ("environment.rubrics[0].config.labels.correct", "nan"),
        ("environment.rubrics[0].config.score_range[1]", "nan"),
        ("environment.rubrics[0].config.timeout_s", "nan"),
        ("environment.rubrics[0].config.failure_score", "nan"),
        ("algorithm.clip_epsilon", "inf"),
    ]:
        assert f"{path}: {value} is not a finite number" in out, out
    assert "Traceback" not in out


def test_typed_and_untyped_fields_alike_and_the_env_section_alone(folder) -> None:
    path = folder / "typed.yaml"
    path.write_text(yaml.safe_dump({"environment": {**_environment([{"name": "a", "rubric": "exact_match", "weight": float("inf")}]),
                                                    "env_config": {"temperature": float("-inf")}}}))
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    assert "environment.rubrics[0].weight: inf is not a finite number" in str(caught.value)
    assert "environment.env_config.temperature: -inf is not a finite number" in str(caught.value)
    with pytest.raises(ConfigError, match=r"environment\.rubrics\[0\]\.config\.score_range\[1\]: nan"):
        parse_env_spec(_environment([{"name": "j", "rubric": "llm_judge", "config": {**JUDGE, "score_range": [0, float("nan")]}}]))


def _env(folder, rubrics: list[dict]):
    path = folder / "entries.yaml"
    path.write_text(yaml.safe_dump({"environment": _environment(rubrics)}))
    manifest = load_manifest(path)
    return make_env_factory(manifest.environment, base_dir=manifest.base_dir)()


@pytest.mark.parametrize(
    "rubrics, named",
    [
        ([{"name": "good", "rubric": "reward.py:fine"}, {"name": "sky", "rubric": "reward.py:up"}], r"rubric 'sky' returned inf as result"),
        ([{"name": "sky", "rubric": "reward.py:up"}, {"name": "pit", "rubric": "reward.py:down"}], r"rubric 'sky' returned inf as result"),
        ([{"name": "pit", "rubric": "reward.py:down"}], r"rubric 'pit' returned -inf as result"),
        ([{"name": "parts", "rubric": "reward.py:huge"}], r"rubric 'parts' returned inf as component 'big'"),
    ],
)
def test_a_rubric_entry_that_is_not_finite_is_refused_naming_the_entry(folder, rubrics, named) -> None:
    env = _env(folder, rubrics)
    env.reset(row_index=0)
    with pytest.raises(RubricError, match=named + r".*a score is a finite number"):
        env.step("2")


def test_a_composite_built_in_python_refuses_a_weight_or_threshold_that_is_not_finite() -> None:
    from agilerl.data.composite import CompositeRubric, RubricEntry, RubricGate
    from agilerl.data.rubric import Rubric

    entry = RubricEntry("one", Rubric.bind(lambda completion: 1.0), 1.0)
    with pytest.raises(RubricError, match=r"entry 'two' has weight inf"):
        CompositeRubric([entry, RubricEntry("two", entry.rubric, float("inf"))])
    with pytest.raises(RubricError, match=r"gate on 'one': min is nan"):
        CompositeRubric([entry], [RubricGate("one", float("nan"))])
