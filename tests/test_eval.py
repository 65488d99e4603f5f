"""``agilerl eval`` on the local route: the tiny model on the built-in guess env, its JSONL rows,
pass@k, resume, and the one-line errors."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import pytest

from agilerl.assembly.evaluation import EvalPlan, evaluate_spec, pass_at_k
from agilerl.cli.main import main
from agilerl.manifest.spec import parse_env_spec
from agilerl.generation.policy import SamplingParams, ScriptedPolicy

TINY = ["--model", "tiny", "--max-new-tokens", "4", "--no-progress"]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _eval_json(capsys, *args: str) -> dict:
    assert main(["eval", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("n", range(1, 6))
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_pass(n):
    for c, k in itertools.product(range(n + 1), range(1, n + 1)):
        outcomes = [True] * c + [False] * (n - c)
        subsets = list(itertools.combinations(outcomes, k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


def test_rows_hold_each_episode_and_the_summary_is_computed_from_them(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    # a low threshold, so the untrained model passes some episodes and not others
    summary = _eval_json(
        capsys, "guess", *TINY, "-n", "3", "-k", "3", "--temperature", "1", "--pass-threshold", "0.02",
        "--max-reward", "1", "--output", str(out),
    )
    rows = _rows(out)
    assert sorted((r["task"], r["sample"]) for r in rows) == [(t, s) for t in range(3) for s in range(3)]
    for r in rows:
        assert (r["model"], r["backend"], r["env"], r["error"]) == ("tiny", "transformers", "guess", None)
        assert r["reward"] == pytest.approx(sum(r["rewards"])) and r["turns"] == len(r["rewards"])
        assert r["passed"] == (r["reward"] >= 0.02)
        messages = r["messages"]
        assert messages[0] == {"role": "user", "content": "Guess a number between 1 and 10."}
        assert [m["role"] for m in messages] == ["user"] + ["assistant", "user"] * r["turns"]
        assert r["info"]["target"] in range(1, 11) and r["seed"] == r["task"]
    rewards = [r["reward"] for r in rows]
    assert summary["episodes"] == 9 and summary["failures"] == 0 and summary["tasks"] == 3
    assert summary["reward_mean"] == pytest.approx(statistics.fmean(rewards))
    assert summary["reward_std"] == pytest.approx(statistics.pstdev(rewards))
    assert summary["accuracy"] == pytest.approx(statistics.fmean(rewards))  # max_reward 1
    per_task = [[r["passed"] for r in rows if r["task"] == t] for t in range(3)]
    for k in (1, 2, 3):
        expected = statistics.fmean(pass_at_k(3, sum(p), k) for p in per_task)
        assert summary["pass_at_k"][f"pass@{k}"] == pytest.approx(expected)
    assert summary["pass_at_k"]["pass@1"] == pytest.approx(statistics.fmean(r["passed"] for r in rows))


def test_progress_into_a_log_is_plain_lines_not_a_squeezed_bar(tmp_path, capsys, monkeypatch):
    """stderr is no terminal here (captured): the progress is ``eval N/M episodes`` lines."""
    for name in ("TTY_COMPATIBLE", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    args = [a for a in TINY if a != "--no-progress"]
    assert main(["eval", "guess", *args, "-n", "3", "-k", "2", "--output", str(tmp_path / "r.jsonl")]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("eval ")]
    assert lines and lines[-1].startswith("eval 6/6 episodes  elapsed 0:00:") and " left ~0:00:00" in lines[-1], err
    assert all(" episodes  elapsed " in line for line in lines)
    assert "━" not in err and "\x1b[" not in err  # no bar, no terminal codes


def test_resume_keeps_finished_rows_drops_a_torn_line_and_plays_the_rest(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    _eval_json(capsys, "guess", *TINY, "-n", "2", "-k", "2", "--temperature", "1", "--output", str(out))
    kept = out.read_text()
    with out.open("a") as f:
        f.write(kept.splitlines()[0][:57])  # a row cut off by a kill mid-write
    summary = _eval_json(
        capsys, "guess", *TINY, "-n", "3", "-k", "2", "--temperature", "1", "--output", str(out), "--resume"
    )
    assert (summary["resumed"], summary["played"], summary["episodes"]) == (4, 2, 6)
    text = out.read_text()
    assert text.startswith(kept)  # the finished rows, unchanged
    assert sorted((r["task"], r["sample"]) for r in _rows(out)) == [(t, s) for t in range(3) for s in range(2)]
    # all done: a second resume plays nothing and reports the same numbers
    again = _eval_json(capsys, "guess", *TINY, "-n", "3", "-k", "2", "--output", str(out), "--resume")
    assert again["played"] == 0 and again["reward_mean"] == summary["reward_mean"] and out.read_text() == text


@pytest.mark.parametrize("tail", [b'{"task": 1, "sa\xff\xfe', b"\xc3\x28\x80garbage\n"], ids=["torn", "with-newline"])
def test_resume_drops_a_non_utf8_tail_with_a_warning_and_keeps_every_earlier_row(tmp_path, capsys, tail):
    """Bytes no UTF-8 decoder takes at the end (a kill mid-write on a damaged disk) are a torn
    last line: dropped with a warning, never a bare UnicodeDecodeError; the same bytes before
    other rows are an error naming the line, the file left as it was."""
    out = tmp_path / "r.jsonl"
    _eval_json(capsys, "guess", *TINY, "-n", "2", "-k", "1", "--output", str(out))
    kept = out.read_bytes()
    out.write_bytes(kept + tail)
    assert main(["eval", "guess", *TINY, "-n", "2", "-k", "1", "--output", str(out), "--resume", "--json"]) == 0
    printed = capsys.readouterr()
    assert f"warning: results file {out}: dropped its damaged last line" in printed.err
    assert (json.loads(printed.out)["resumed"], json.loads(printed.out)["played"]) == (2, 0)
    assert out.read_bytes() == kept  # the earlier rows, unchanged

    damaged = kept.replace(b"\n", b"\n\xff\xfe\n", 1)  # the same bytes between two rows
    out.write_bytes(damaged)
    assert main(["eval", "guess", *TINY, "-n", "2", "-k", "1", "--output", str(out), "--resume"]) == 2
    assert f"results file {out}, line 2: not an eval row" in capsys.readouterr().err
    assert out.read_bytes() == damaged


@pytest.mark.parametrize(
    "args, message",
    [
        (["guess", "--no-progress"], "--model is required"),
        ([*TINY], "name the env"),
        (["guess", *TINY, "--backend", "nope"], "no backend named 'nope' is registered. Installed backends: transformers"),
        (["guess", *TINY, "--base-url", "http://127.0.0.1:9/v1", "--backend", "vllm"], "--backend applies to a local model"),
        (["no_such_env_xyz", *TINY], "no_such_env_xyz"),
        (["guess", *TINY, "-k", "0"], "-k/--samples: must be above 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, capsys, tmp_path):
    try:
        code = main(["eval", *args, "--output", str(tmp_path / "r.jsonl")])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_results_file_from_another_run_is_never_mixed_in(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    _eval_json(capsys, "guess", *TINY, "-n", "1", "--output", str(out))
    assert main(["eval", "guess", *TINY, "-n", "1", "--output", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["eval", "guess", *TINY, "--env-config", '{"high": 5}', "-n", "1", "--output", str(out), "--resume"]) == 2
    assert "'env_config': {}" in capsys.readouterr().err  # another env's rows
    out.write_text(out.read_text().replace('"model": "tiny"', '"model": "other"'))
    assert main(["eval", "guess", *TINY, "-n", "1", "--output", str(out), "--resume"]) == 2
    assert "'model': 'other'" in capsys.readouterr().err


def test_every_episode_of_a_batch_shares_one_generate_call_per_turn(chatml_tokenizer, tmp_path):
    """Concurrent episodes: 6 episodes of one turn each at concurrency 6 cost one generate call;
    at concurrency 4, two."""
    spec = parse_env_spec({"env_type": "rollout", "entrypoint": "guess", "env_config": {"target": 7}})
    for concurrency, calls in ((6, 1), (4, 2)):
        policy = ScriptedPolicy(chatml_tokenizer, reply="7")
        plan = EvalPlan(
            output=tmp_path / f"{concurrency}.jsonl", num_tasks=3, samples=2, concurrency=concurrency,
            sampling=SamplingParams(temperature=0.0, max_new_tokens=4), max_reward=1.0,
        )
        summary = evaluate_spec(spec, policy, chatml_tokenizer, plan)
        assert policy.calls == calls
        assert (summary.episodes, summary.reward_mean, summary.accuracy, summary.pass_at_k) == (6, 1.0, 1.0, {1: 1.0, 2: 1.0})
        row = _rows(plan.output)[0]
        assert row["messages"] == [
            {"role": "user", "content": "Guess a number between 1 and 10."},
            {"role": "assistant", "content": "7"},
            {"role": "user", "content": "Correct!"},
        ]
        assert (row["turns"], row["passed"], row["terminated"]) == (1, True, True)



class HeldOutEnv:
    """A served env with a held-out split of 3 rows; reward 2 for the reply "even"."""

    max_turns = 2
    max_reward = 2.0
    eval_dataset_size = 3
    resets: list = []

    def reset(self, seed=None, *, row_index=None, evaluation=None):
        type(self).resets.append((row_index, evaluation))
        return f"row {row_index}", {}

    def step(self, action):
        return "done", 2.0 * (action.strip() == "even"), True, False, {}


def test_a_remote_env_plays_its_held_out_split_with_max_reward_from_its_metadata(chatml_tokenizer, tmp_path, capsys):
    from agilerl.remote.hosting import resolve_env

    HeldOutEnv.resets = []
    url, server = resolve_env(HeldOutEnv)
    with server:
        spec = parse_env_spec({"env_type": "rollout", "env_url": url})
        plan = EvalPlan(output=tmp_path / "r.jsonl", samples=2, sampling=SamplingParams(temperature=0, max_new_tokens=4))
        summary = evaluate_spec(spec, ScriptedPolicy(chatml_tokenizer, reply="even"), chatml_tokenizer, plan)
        assert (summary.tasks, summary.episodes, summary.accuracy, summary.pass_at_k) == (3, 6, 1.0, {1: 1.0, 2: 1.0})
        assert sorted(r for r in HeldOutEnv.resets if r[1]) == sorted([(0, True), (1, True), (2, True)] * 2)
        assert [r["messages"][0]["content"] for r in _rows(plan.output)][::2] == ["row 0", "row 1", "row 2"]
        # the same through the command line, named by --env-url
        out = tmp_path / "cli.jsonl"
        assert main(["eval", "--env-url", url, *TINY, "-n", "2", "--output", str(out)]) == 0
        assert [(r["env"], r["row_index"]) for r in _rows(out)] == [(url, 0), (url, 1)]


def test_concurrency_is_lowered_to_what_the_env_server_admits(chatml_tokenizer, tmp_path):
    from agilerl.remote.hosting import resolve_env

    url, server = resolve_env(HeldOutEnv, max_concurrent_envs=3)
    with server:
        spec = parse_env_spec({"env_type": "rollout", "env_url": url})
        policy = ScriptedPolicy(chatml_tokenizer, reply="even")
        plan = EvalPlan(output=tmp_path / "r.jsonl", samples=2, concurrency=16, sampling=SamplingParams(temperature=0, max_new_tokens=4))
        summary = evaluate_spec(spec, policy, chatml_tokenizer, plan)
    assert summary.episodes == 6 and policy.calls == 3  # 2 episodes at a time


def test_a_plugins_generation_backend_is_chosen_by_name(tmp_path, capsys):
    """A backend registered through register_generation_backends generates for --backend NAME."""
    import types

    from agilerl import hookimpl
    from agilerl.registry import get_plugin_manager, reset_registry

    built = []

    def scripted_backend(model, tokenizer, *, max_model_len, seed, **options):
        built.append((type(model).__name__, max_model_len, seed, options))
        return ScriptedPolicy(tokenizer, reply="7")

    module = types.ModuleType("scripted_backend_plugin")
    module.register_generation_backends = hookimpl(lambda register: register("scripted", scripted_backend))
    reset_registry()
    get_plugin_manager().register(module, name="scripted-backend")
    try:
        summary = _eval_json(
            capsys, "guess", *TINY, "--backend", "scripted", "--env-config", '{"target": 7}', "-n", "2",
            "--max-model-len", "256", "--seed", "3", "--output", str(tmp_path / "r.jsonl"),
        )
    finally:
        reset_registry()
    assert built == [("Qwen2ForCausalLM", 256, 3, {})]
    assert summary["reward_mean"] == 1.0 and {r["backend"] for r in _rows(tmp_path / "r.jsonl")} == {"scripted"}
