"""agilerl view's pages in a real browser (headless Chromium, Debian's, installed by .ci/run): after
the page's script ran, the DOM of the main job's run, a vision run, a tool run and an eval file
shows charts, transcripts, rewards, pictures and tool call statuses; with every host unresolvable
and the proxy dead the page still renders, and nothing in it points at the network. Served, the
page shows the rows a run appends while it is open.

Without Chromium these tests skip, saying so, unless CI is set: there they fail."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from agilerl.cli.main import main
from tests.test_viewer import offline_links
from tests.viewer_runs import eval_file, tool_run, train_run, vision_run

_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
_CHROMIUM = next((path for name in _NAMES if (path := shutil.which(name))), None)
_MISSING = "no Chromium on PATH: apt-get install chromium (.ci/run does) to check the viewer in a browser"

# pip cannot install a browser: a user's machine without one skips these, CI fails them
pytestmark = pytest.mark.skipif(_CHROMIUM is None and not os.environ.get("CI"), reason=_MISSING)


@pytest.fixture(scope="module")
def chromium() -> str:
    if _CHROMIUM is None:  # only under CI (the mark skips elsewhere): a missing browser fails
        pytest.fail(_MISSING)
    return _CHROMIUM


def _browse(chromium: str, page: Path, *extra: str) -> str:
    """The DOM after the page's script ran (or what ``extra`` asks instead: a screenshot), in a
    browser that can reach no host."""
    args = [
        chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
        '--host-resolver-rules=MAP * ~NOTFOUND', "--proxy-server=http://127.0.0.1:9", "--virtual-time-budget=5000",
        *(extra or ("--dump-dom",)), page.resolve().as_uri(),
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _page(source: Path, out: Path) -> Path:
    assert main(["view", str(source), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("browser")
    made = {"train": train_run(folder, steps=3), "tools": tool_run(folder), "eval": eval_file(folder)}
    return {kind: _page(source, folder / f"{kind}.html") for kind, source in made.items()}


def test_the_main_jobs_run_renders_charts_transcripts_and_rewards(chromium, pages):
    dom = _browse(chromium, pages["train"])
    assert dom.count('class="chart"') >= 2  # reward and loss at least, drawn by the script
    assert 'class="turn model"' in dom and 'class="turn prompt"' in dom and 'class="turn env"' in dom
    assert "Guess a number between 1 and 10." in dom
    assert "reward " in dom and "step 3: 4 samples, mean reward" in dom
    assert offline_links(dom) == []


def test_a_tool_run_shows_each_call_and_its_status(chromium, pages):
    dom = _browse(chromium, pages["tools"])
    assert 'class="status ok"' in dom and ">unknown_tool<" in dom and 'class="status bad"' in dom
    assert "failed tool" in dom  # the episode's badge, what the filter selects
    assert offline_links(dom) == []


def test_an_eval_file_shows_its_transcripts_and_a_chart(chromium, pages):
    dom = _browse(chromium, pages["eval"])
    assert 'aria-label="reward by task"' in dom and 'class="turn model"' in dom
    assert "task 0" in dom and "task 1" in dom
    assert offline_links(dom) == []


@pytest.mark.slow
def test_a_vision_runs_pictures_are_img_elements_from_the_page_itself(chromium, tmp_path):
    page = _page(vision_run(tmp_path), tmp_path / "vision.html")
    dom = _browse(chromium, page)
    images = dom.count('<img src="data:image/jpeg;base64,')
    assert images >= 4 and images == dom.count("<img")  # every picture inline, none fetched
    assert offline_links(dom) == []


def test_a_screenshot_of_the_page(chromium, pages, tmp_path):
    shot = tmp_path / "page.png"
    _browse(chromium, pages["train"], f"--screenshot={shot}", "--window-size=1200,900", "--hide-scrollbars")
    assert shot.stat().st_size > 20_000  # a drawn page, not a blank one (docs/viewer.png is one such)


def test_the_served_page_shows_rows_the_run_appends_while_it_is_open(chromium, pages, tmp_path):
    """--serve: rows the run appends after the page's first poll are on the page after the next."""
    import json

    from agilerl.view.serve import ViewServer
    from agilerl.view.sources import open_source
    from tests.viewer_runs import copy_run

    run = copy_run(pages["train"].parent / "run", tmp_path / "live")
    server = ViewServer([open_source(run)], title="live", port=0).start()
    polls: list[list] = []
    poll = server.poll

    def poll_then_append(since):  # the run writes step 4 right after the page's first poll
        reply = poll(since)
        polls.append(since)
        if len(polls) == 1:
            record = json.loads((run / "rollouts.jsonl").read_text().splitlines()[0])
            with (run / "rollouts.jsonl").open("a") as f:
                f.write(json.dumps({**record, "step": 4, "reward": 0.875}) + "\n")
            with (run / "metrics.jsonl").open("a") as f:
                f.write(json.dumps({"step": 4, "train/reward": 0.875}) + "\n")
        return reply

    server.poll = poll_then_append  # type: ignore[method-assign]
    try:  # 10 s of the page's time: a poll every 2 s
        done = subprocess.run(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000", "--dump-dom", server.url],
            capture_output=True, text=True, timeout=120,
        )
    finally:
        server.stop()
    assert len(polls) >= 2 and polls[0] == [[3, 12]], polls  # the page held 3 rows and 12 records
    assert "step 4: 1 samples, mean reward 0.875" in done.stdout  # it moved on to the new step
    assert "train/reward at step 4: 0.875" in done.stdout  # and the chart drew the new row
    assert offline_links(done.stdout) == []
