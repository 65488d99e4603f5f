"""rollouts.jsonl: every sample with ``all`` (N a step, none with 0), the fields a reader needs
(episode, group, reward and its parts, turns that cover the exact tokens, tool calls with their
status, pictures as small files), and the metrics.jsonl rules across a kill and a resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from agilerl.manifest.settings import TrainingSettings
from agilerl.train.metrics import read_metrics
from agilerl.train.records import ROLLOUTS_FILE, THUMBNAIL_PX
from tests.viewer_runs import guess_manifest, tool_run, train_run, vision_run


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / ROLLOUTS_FILE).read_text().splitlines()]


@pytest.fixture(scope="module")
def all_run(tmp_path_factory) -> Path:
    return train_run(tmp_path_factory.mktemp("all"), steps=2, record_rollouts="all")


def test_all_records_every_sample_of_every_step_with_its_tokens_and_turns(all_run):
    records = _records(all_run)
    assert Counter(r["step"] for r in records) == {1: 4, 2: 4}  # batch 2 x group 2, each step
    for step in (1, 2):
        mine = [r for r in records if r["step"] == step]
        assert sorted(r["group"] for r in mine) == [0, 0, 1, 1]  # as GRPO compared them
        assert len({r["episode"] for r in mine}) == 4
    for r in records:
        assert {"reward", "rewards", "reward_components", "truncated", "terminated", "error"} <= set(r)
        assert r["reward"] == pytest.approx(sum(r["rewards"]))
        ids, mask = r["token_ids"], r["mask"]
        assert len(ids) == len(mask) and set(mask) <= {0, 1} and any(mask)
        turns = r["turns"]
        assert turns[0]["role"] == "prompt" and "Guess a number" in turns[0]["text"]
        assert [t["start"] for t in turns[1:]] == [t["end"] for t in turns[:-1]] and turns[-1]["end"] == len(ids)
        for t in turns:  # each part is one speaker's: the model's tokens apart from the env's
            assert set(mask[t["start"] : t["end"]]) == {1 if t["role"] == "model" else 0}
        assert [t["turn"] for t in turns if t["role"] == "model"] == list(range(len(r["rewards"])))
        # sync: every generated token by the weights this step updated (version step - 1), staleness 0
        assert {v for v, m in zip(r["versions"], mask) if m} == {r["step"] - 1}
        assert r["staleness"] == {"mean": 0.0, "max": 0.0}
    rows = read_metrics(all_run / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2]


def test_n_per_step_keeps_whole_groups_first_and_0_writes_nothing(tmp_path, capsys):
    run = train_run(tmp_path / "three", steps=2, record_rollouts=3)
    records = _records(run)
    assert Counter(r["step"] for r in records) == {1: 3, 2: 3}
    assert [r["group"] for r in records if r["step"] == 1] == [0, 0, 1]  # in slot order: group 0 whole
    assert f"samples:    {run / ROLLOUTS_FILE} (see them: agilerl view {run})" in capsys.readouterr().out
    none = train_run(tmp_path / "none", steps=1, record_rollouts=0)
    assert not (none / ROLLOUTS_FILE).exists() and "samples:" not in capsys.readouterr().out


def test_the_default_is_a_few_samples_and_a_bad_value_names_the_field():
    from pydantic import ValidationError

    assert TrainingSettings().record_rollouts == 8
    assert TrainingSettings(record_rollouts="all").record_rollouts == "all"
    for bad, said in ((-1, "negative"), ("most", "'most' is not 'all'"), (True, "bool")):
        with pytest.raises(ValidationError, match="record_rollouts") as caught:
            TrainingSettings(record_rollouts=bad)
        assert said in str(caught.value)


def test_the_manifest_error_names_the_field_on_the_command_line(tmp_path, capsys):
    from agilerl.cli.main import main

    manifest = guess_manifest(tmp_path, record_rollouts="some")
    assert main(["train", str(manifest), "--output-dir", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "record_rollouts" in err and "'some'" in err and "Traceback" not in err


def test_tool_calls_are_kept_per_model_turn_with_their_status(tmp_path):
    records = _records(tool_run(tmp_path))
    assert [r["reward"] for r in records] == [1.0, 0.0]
    model_turns = [t for t in records[0]["turns"] if t["role"] == "model"]
    assert [[c["status"] for c in t["tool_calls"]] for t in model_turns] == [["ok", "unknown_tool"], ["ok"]]
    assert model_turns[0]["tool_calls"][0]["result"] == "5"
    env = [t for t in records[0]["turns"] if t["role"] == "env"]
    assert "<tool_response>\n5\n</tool_response>" in env[0]["text"]


@pytest.mark.slow
def test_pictures_are_small_files_beside_the_records_never_inline(tmp_path):
    run = vision_run(tmp_path)
    text = (run / ROLLOUTS_FILE).read_text()
    assert "base64" not in text and max(len(line) for line in text.splitlines()) < 50_000
    shown = [i for r in _records(run) for t in r["turns"] for i in t.get("images", [])]
    assert len(shown) == 8 and all(i["width"] == 320 for i in shown)  # one picture an episode: its true size
    for image in shown:
        path = run / image["file"]
        assert path.stat().st_size < 60_000
        with Image.open(path) as opened:
            assert max(opened.size) <= THUMBNAIL_PX
    assert all(t["role"] == "prompt" for r in _records(run) for t in r["turns"] if "images" in t)
    # a model's placeholder run is shown once, with its count: the text stays readable
    assert "<|image_pad|>\u00d7" in _records(run)[0]["turns"][0]["text"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_killed_run_resumes_with_no_torn_line_and_no_step_twice(tmp_path):
    """SIGKILL mid-run, a torn line left as a crash mid-write leaves it, --resume to the end:
    every step has exactly its N records, once, and every line is whole."""
    max_steps = 6
    manifest = guess_manifest(tmp_path, record_rollouts=3, checkpoint_interval=2)
    out = tmp_path / "out"
    args = [sys.executable, "-m", "agilerl", "train", str(manifest), "--output-dir", str(out),
            "--max-steps", str(max_steps), "--no-progress"]
    killed = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoints" / "step-000002").is_dir() or len(read_metrics(out / "metrics.jsonl")) < 3:
            assert killed.poll() is None, killed.stderr.read() if killed.stderr else ""
            assert time.monotonic() < deadline, "no third step within 240 s"
            time.sleep(0.05)
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=60)
    with (out / ROLLOUTS_FILE).open("a") as f:
        f.write('{"step": 4, "episode": "torn", "tur')  # a write cut off by the kill
    resumed = subprocess.run([*args, "--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    records = _records(out)  # every line parses: none torn
    assert Counter(r["step"] for r in records) == {step: 3 for step in range(1, max_steps + 1)}
    assert [r["step"] for r in records] == sorted(r["step"] for r in records)
    assert [row["step"] for row in read_metrics(out / "metrics.jsonl")] == list(range(1, max_steps + 1))
    assert "torn" not in (out / ROLLOUTS_FILE).read_text()


def test_async_records_carry_each_tokens_version_and_the_staleness_the_bound_allows(tmp_path):
    run = train_run(tmp_path, steps=4, record_rollouts="all", rollout_mode="async", max_staleness=1)
    records = _records(run)
    assert Counter(r["step"] for r in records) == {1: 4, 2: 4, 3: 4, 4: 4}
    for r in records:
        made = [v for v, m in zip(r["versions"], r["mask"]) if m]
        assert made and all(r["step"] - 2 <= v <= r["step"] - 1 for v in made)  # within max_staleness 1
        lags = [r["step"] - 1 - v for v in made]
        assert r["staleness"] == {"mean": pytest.approx(sum(lags) / len(lags)), "max": float(max(lags))}
        assert [v for v, m in zip(r["versions"], r["mask"]) if not m] == [-1] * (len(r["mask"]) - len(made))


def test_an_episode_split_into_samples_gives_a_record_each_sharing_its_episode(tmp_path):
    from agilerl.train.records import RolloutRecorder
    from agilerl.train.tiny_model import build_tiny_tokenizer
    from tests.test_split_samples import TURNS_A, episode

    traj = episode(TURNS_A, (0.0, 0.0, 1.0), split=True, group=1)
    recorder = RolloutRecorder(tmp_path, build_tiny_tokenizer(), 2)  # two of its three samples
    recorder.add([traj], version=0)
    recorder.write(1)
    records = _records(tmp_path)
    assert [(r["episode"], r["sample"], r["samples"], r["group"]) for r in records] == [
        (traj.episode, 0, 3, 1), (traj.episode, 1, 3, 1)
    ]
    assert [r["token_ids"] for r in records] == [s.token_ids for s in traj.samples[:2]]
    assert [t["turn"] for t in records[1]["turns"] if t["role"] == "model"] == [1]  # the episode's turn index
    assert records[0]["reward"] == records[1]["reward"] == 1.0  # the episode's, on each of its samples


def test_a_step_of_several_batches_numbers_its_groups_on(tmp_path):
    """Gradient accumulation: each batch's groups are new groups of the step, never merged."""
    records = _records(train_run(tmp_path, steps=1, record_rollouts="all", gradient_accumulation_steps=2))
    assert [(r["group"], r["index"]) for r in records] == [(g, i) for i, g in enumerate((0, 0, 1, 1, 2, 2, 3, 3))]
