"""What a run shows besides the trackers: the reward curve's labelled axes and eval markers, the
progress bar's labelled times, and ``--no-progress``'s plain lines, never silent for long."""

from __future__ import annotations

import re

from agilerl.train.metrics import ProgressBar, draw_curves


def test_the_curve_has_labelled_axes_and_eval_points_that_stand_out():
    records = [{"step": 0, "eval/reward": 0.0}]
    records += [{"step": s, "train/reward": s / 50, **({"eval/reward": 1.0} if s % 25 == 0 else {})} for s in range(1, 51)]
    ax = draw_curves(records, ("train/reward", "eval/reward"), title="GRPO").axes[0]
    assert ax.get_xlabel().startswith("step") and "reward" in ax.get_ylabel()
    train, evals = ax.get_lines()
    assert (train.get_label(), evals.get_label()) == ("train/reward", "eval/reward")
    assert list(evals.get_xdata()) == [0, 25, 50]
    assert train.get_marker() in (None, "None", "")  # 50 train points: a plain line
    assert evals.get_marker() == "D" and evals.get_markersize() > 5  # evaluations: big markers on top
    assert evals.get_color() != train.get_color() and evals.get_zorder() > train.get_zorder()


def test_the_bar_labels_its_times(capsys, monkeypatch):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # a terminal, as rich tells one (elsewhere: plain lines)
    bar = ProgressBar(4, 0)
    with bar.running():
        for step in range(1, 5):
            bar.update(step, {"train/reward": 0.5, "train/loss": 0.25})
    err = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", capsys.readouterr().err)  # the terminal's colour codes
    assert "4/4 elapsed 0:00:0" in err and " left 0:00:00 " in err and "reward 0.500" in err


def test_without_the_bar_a_line_every_tenth_of_the_run_or_every_few_seconds(capsys, monkeypatch):
    bar = ProgressBar(20, 0, show=False, lines=True)
    with bar.running():
        for step in range(0, 21):
            bar.update(step, {"train/reward": step / 20})
    lines = capsys.readouterr().err.splitlines()
    assert [line.split()[1] for line in lines] == [f"{s}/20" for s in range(2, 21, 2)]
    assert lines[-1].startswith("step 20/20  reward 1.000") and " elapsed 0:00:0" in lines[-1] and "left ~0:00:00" in lines[-1]

    monkeypatch.setattr(ProgressBar, "LINE_EVERY_S", 0.0)  # a slow run: the time bound fires first
    bar = ProgressBar(100, 40, show=False, lines=True)
    for step in range(41, 44):
        bar.update(step, {"train/loss": 1.0})
    assert [line.split()[1] for line in capsys.readouterr().err.splitlines()] == ["41/100", "42/100", "43/100"]

    quiet = ProgressBar(20, 0, show=False)  # another rank, or the bar off without lines: silent
    quiet.update(20, {"train/reward": 1.0})
    assert capsys.readouterr().err == ""


def test_the_bar_asked_for_without_a_terminal_is_plain_lines(capsys, monkeypatch):
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    bar = ProgressBar(2, 0)  # the bar is asked for; stderr is pytest's capture, no terminal
    with bar.running():
        for step in (1, 2):
            bar.update(step, {"train/reward": 0.5})
    lines = capsys.readouterr().err.splitlines()
    assert [line.split()[:2] for line in lines] == [["step", "1/2"], ["step", "2/2"]]


def test_a_steps_batches_make_one_row_counts_summed_maxima_largest_the_rest_averaged():
    from agilerl.train.metrics import combine_metrics

    parts = [
        {"train/reward": 0.25, "rollout/dropped_stale": 2.0, "rollout/staleness_max": 1.0, "judge/calls": 5.0},
        {"train/reward": 0.75, "rollout/dropped_stale": 1.0, "rollout/staleness_max": 2.0, "reward/format": 1.0},
    ]
    assert combine_metrics(parts) == {
        "train/reward": 0.5, "rollout/dropped_stale": 3.0, "rollout/staleness_max": 2.0,
        "judge/calls": 5.0, "reward/format": 1.0,  # over the batches that report it
    }
