"""agilerl view without a browser: the page of a train, tool and eval run holds their data and
nothing that reaches the network; a 100k-record run makes a bounded page; --serve picks up rows
a running training appends; the viewer imports no training code."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from urllib.parse import quote
from html.parser import HTMLParser
from pathlib import Path

import pytest

from agilerl.cli.main import main
from agilerl.view.page import choose, page_data
from agilerl.view.serve import ViewServer
from agilerl.view.sources import open_source
from tests.viewer_runs import copy_run, eval_file, synthetic_run, tool_run, train_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("viewer")
    return {"train": train_run(folder, steps=3), "tools": tool_run(folder), "eval": eval_file(folder)}


class _Links(HTMLParser):
    """Every src and href in a page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.links += [value or "" for name, value in attrs if name in ("src", "href")]


def offline_links(html: str) -> list[str]:
    """The src/href values that would reach the network (none may)."""
    parser = _Links()
    parser.feed(html)
    return [link for link in parser.links if re.match(r"\s*(https?:)?//", link, re.IGNORECASE)]


def _embedded(html: str) -> dict:
    return json.loads(html.split('<script type="application/json" id="data">')[1].split("</script>")[0])


@pytest.mark.parametrize("kind", ["train", "tools", "eval"])
def test_the_page_embeds_the_run_inline_and_links_nothing_outside(runs, kind, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert main(["view", str(runs[kind]), "--out", str(out)]) == 0
    assert f"page:    {out}" in capsys.readouterr().out
    html = out.read_text()
    assert offline_links(html) == [] and "<script src" not in html and "<link" not in html
    assert "default-src 'none'" in html  # the browser itself refuses any request the page would make
    data = _embedded(html)
    (run,) = data["runs"]
    assert run["total"] == len(run["records"]) > 0 and data["live"] is False
    if kind == "train":
        assert [row["step"] for row in run["metrics"]] == [1, 2, 3]
        assert [s[0] for s in run["steps"]] == [1, 2, 3] and all(s[1] == 4 for s in run["steps"])
    if kind == "tools":
        assert run["records"][0]["flags"] == ["failed_tool"]  # the unknown tool's call
    if kind == "eval":
        assert run["kind"] == "eval" and {r["group"] for r in run["records"]} == {0, 1}
        first = run["records"][0]["turns"]
        assert first[0]["role"] == "prompt" and first[1]["role"] == "model"


def test_two_runs_side_by_side_and_a_default_output(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["view", str(runs["train"]), str(runs["eval"])]) == 0
    data = _embedded((tmp_path / "view.html").read_text())
    assert [r["kind"] for r in data["runs"]] == ["train", "eval"]
    assert main(["view", str(runs["eval"])]) == 0
    assert runs["eval"].with_suffix(".html").is_file()  # beside the results file


def test_text_from_a_run_can_never_become_markup(runs, tmp_path):
    run = copy_run(runs["train"], tmp_path / "hostile")
    lines = (run / "rollouts.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["turns"][1]["text"] = '</script><img src="https://example.com/x.png"><script>alert(1)</script>'
    (run / "rollouts.jsonl").write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    out = tmp_path / "page.html"
    assert main(["view", str(run), "-o", str(out)]) == 0
    html = out.read_text()
    assert offline_links(html) == [] and html.count("</script>") == 2  # the page's own two
    assert _embedded(html)["runs"][0]["records"][0]["turns"][1]["text"].startswith("</script><img")


def test_user_errors_name_the_fix(tmp_path, capsys):
    assert main(["view", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["view", str(tmp_path)]) == 2
    assert "holds neither rollouts.jsonl nor metrics.jsonl" in capsys.readouterr().err
    (tmp_path / "other.jsonl").write_text('{"a": 1}\n')
    assert main(["view", str(tmp_path / "other.jsonl")]) == 2
    assert "not an eval results file" in capsys.readouterr().err


def test_the_viewer_needs_no_training_stack(runs, tmp_path):
    """What the plain install has is enough: no torch, transformers, datasets or matplotlib."""
    code = (
        "import sys; from agilerl.cli.main import main\n"
        f"assert main(['view', {str(runs['train'])!r}, '-o', {str(tmp_path / 'p.html')!r}]) == 0\n"
        "heavy = {'torch', 'transformers', 'datasets', 'matplotlib', 'numpy'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_a_run_of_100k_records_makes_a_page_of_bounded_size(tmp_path):
    run = synthetic_run(tmp_path / "big", steps=1000, per_step=100)
    source = open_source(run)
    assert len(source.entries) == 100_000 and (run / "rollouts.jsonl").stat().st_size > 60 * 2**20
    out = tmp_path / "page.html"
    assert main(["view", str(run), "-o", str(out), "--max-mb", "24"]) == 0
    assert out.stat().st_size < 30 * 2**20  # tens of MB at most (bench/viewer.py times it)
    data = _embedded(out.read_text())["runs"][0]
    assert len(data["steps"]) == 1000 and len(data["metrics"]) == 1000  # every step listed and charted
    assert 10_000 < len(data["records"]) < 100_000 and data["total"] == 100_000
    steps = {r["step"] for r in data["records"]}
    assert steps == set(range(1, 1001))  # each step keeps some: its lowest and highest first
    first = [r for r in data["records"] if r["step"] == 1]
    rewards = [e.reward for e in source.entries if e.step == 1]
    assert min(r["reward"] for r in first) == min(rewards) and max(r["reward"] for r in first) == max(rewards)


def test_choose_samples_steps_when_even_one_record_each_does_not_fit(tmp_path):
    source = open_source(synthetic_run(tmp_path / "run", steps=50, per_step=4))
    mean = sum(e.length for e in source.entries) / len(source.entries)
    chosen = choose(source.entries, budget=int(mean * 10) + 1)
    assert len(chosen) == 10 and chosen[-1].step == 50 and chosen[0].step == 1  # spread, the last kept
    assert len(page_data([source], budget=10**9)["runs"][0]["records"]) == 200


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as reply:  # noqa: S310 - our own loopback server
        return reply.read()


def test_serve_picks_up_rows_a_running_training_appends(runs, tmp_path):
    run = copy_run(runs["train"], tmp_path / "live")
    server = ViewServer([open_source(run)], title="live", port=0).start()
    try:
        assert server.url.startswith("http://127.0.0.1:")
        page = _get(server.url).decode()
        assert offline_links(page) == [] and _embedded(page)["live"] is True
        since = [[3, 12]]
        poll = json.loads(_get(f"{server.url}api/poll?since={quote(json.dumps(since))}"))
        assert poll["runs"][0]["metrics"] == [] and poll["runs"][0]["total"] == 12
        record = json.loads((run / "rollouts.jsonl").read_text().splitlines()[0])
        with (run / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"step": 4, "train/reward": 0.75}) + "\n")
        with (run / "rollouts.jsonl").open("a") as f:  # step 4: one whole line, one still being written
            f.write(json.dumps({**record, "step": 4, "reward": 0.75}) + "\n" + json.dumps({**record, "step": 4})[:40])
        poll = json.loads(_get(f"{server.url}api/poll?since={quote(json.dumps(since))}"))["runs"][0]
        assert [row["step"] for row in poll["metrics"]] == [4] and poll["total"] == 13
        assert poll["steps"][-1] == [4, 1, 0.75]
        step = json.loads(_get(f"{server.url}api/step?run=0&step=4"))
        assert [r["reward"] for r in step["records"]] == [0.75]
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/reward": 0.1}) + "\n")  # cut back: a resume
        poll = json.loads(_get(f"{server.url}api/poll?since={quote(json.dumps([[4, 13]]))}"))["runs"][0]
        assert poll["reset"] is True and [row["step"] for row in poll["metrics"]] == [1]
    finally:
        server.stop()


def test_a_port_out_of_range_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["view", "x", "--serve", "--port", "70000"])
    assert exited.value.code == 2 and "is not a port" in capsys.readouterr().err
