"""``agilerl eval`` against a server whose ``/metadata`` claims a huge ``eval_dataset_size`` is
refused by training's bound on rows (``refuse_too_many_rows``), naming the field and the way out,
instead of spending memory on the episodes' list until a bare ``MemoryError``."""

from __future__ import annotations

from aiohttp import web

from agilerl.cli.main import main
from agilerl.rollout.assigner import MAX_SHUFFLED_ROWS
from tests.loopback import LoopbackServer


def _claiming(eval_dataset_size: int) -> LoopbackServer:
    async def metadata(request: web.Request) -> web.Response:
        return web.json_response({"name": "huge", "eval_dataset_size": eval_dataset_size, "max_turns": 2})

    app = web.Application()
    app.router.add_get("/metadata", metadata)
    return LoopbackServer(app)


def test_eval_refuses_an_eval_dataset_size_of_10_to_the_12_by_trainings_bound(tmp_path, capsys):
    server = _claiming(10**12)
    try:
        code = main(["eval", "--env-url", server.url, "--model", "tiny", "--output", str(tmp_path / "out.jsonl"),
                     "--no-progress"])
    finally:
        server.stop()
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"the env's eval_dataset_size {10**12} is more rows than a run deals out (at most {MAX_SHUFFLED_ROWS:,}" in err
    assert "--num-tasks N" in err and "MemoryError" not in err
    assert not (tmp_path / "out.jsonl").exists()  # refused before the results file


def test_eval_refuses_as_many_tasks_times_samples_past_the_bound(tmp_path, capsys):
    code = main(["eval", "guess", "--model", "tiny", "-n", str(MAX_SHUFFLED_ROWS), "-k", "2",
                 "--output", str(tmp_path / "out.jsonl"), "--no-progress"])
    assert code == 2
    assert f"num_tasks x samples {2 * MAX_SHUFFLED_ROWS} is more rows than a run deals out" in capsys.readouterr().err
