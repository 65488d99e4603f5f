"""OpenEnv's RFC 004 rubrics (openenv-core's real classes, in its side venv) wherever a rubric
is: bound as ours, sync and async, containers included, in a rubric file, inside a composite,
with an LLMJudge on a loopback endpoint, and as an OpenEnv env's own ``rubric``; every named
part (``named_rubrics()``) is a component, each call seeing its own parts only."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.test_openenv_native import run_script, side_python  # noqa: F401 - the side venv fixture
from tests.test_remote_openenv import openenv_python  # noqa: F401 - the side venv fixture

RUBRICS = textwrap.dedent('''
    import asyncio

    from openenv.core.rubrics import Gate, Rubric, RubricDict, Sequential, TrajectoryRubric, WeightedSum


    class Exact(Rubric):
        def forward(self, action, observation):
            return float(action.strip() == str(observation.answer))


    class Short(Rubric):
        def forward(self, action, observation):
            return 1.0 if len(action) < 5 else 0.0


    class Slow(Rubric):
        """An async part: the tree becomes async."""

        async def forward(self, action, observation):
            await asyncio.sleep(0.01)
            return 0.5


    class PerTask(Rubric):
        def __init__(self):
            super().__init__()
            self.tasks = RubricDict({"math": Exact(), "chat": Short()})

        def forward(self, action, observation):
            return self.tasks[observation.row["task"]](action, observation)


    class Episode(TrajectoryRubric):
        def score_trajectory(self, trajectory):
            return float(len(trajectory))  # one answer, one step: 1.0 unless steps leak between calls

        def compute_step_rewards(self):
            return [1.0] * len(self._trajectory)


    class Scaled(Rubric):
        def __init__(self, factor):
            super().__init__()
            self.factor = factor

        def forward(self, action, observation):
            return self.factor * len(action)


    weighted = WeightedSum([Gate(Exact(), threshold=1.0), Short()], weights=[0.7, 0.3])
    mixed = WeightedSum([Gate(Exact(), threshold=1.0), Short(), Slow()], weights=[0.5, 0.3, 0.2])
    chain = Sequential(Exact(), Short())
    per_task = PerTask()
''')

SCORE = textwrap.dedent('''
    import json, sys, threading
    from agilerl.data.composite import CompositeRubric, RubricEntry
    from agilerl.data.rubric import Rubric, load_rubric

    def score(rubric, text, answer="4", task="math"):
        return list(rubric.score(text, {"answer": answer, "question": "2+2?", "task": task}, {}, "row 0"))

    out = {}
''')


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "rubric.py").write_text(RUBRICS)
    return tmp_path


def test_openenv_trees_score_with_every_named_part_a_component(side_python, folder):  # noqa: F811
    out = run_script(side_python, SCORE + textwrap.dedent('''
        for name in ("weighted", "mixed", "chain", "per_task", "Episode"):
            out[name] = [score(load_rubric(name, "rubric.py"), t) for t in ("4", "5", "4 or so")]
        out["tasks"] = score(load_rubric("per_task", "rubric.py"), "hello", task="chat")
        print(json.dumps(out))
    '''), folder)
    assert out["weighted"] == [
        [1.0, {"rubric_0": 1.0, "rubric_0.rubric": 1.0, "rubric_1": 1.0}],
        [pytest.approx(0.3), {"rubric_0": 0.0, "rubric_0.rubric": 0.0, "rubric_1": 1.0}],
        [0.0, {"rubric_0": 0.0, "rubric_0.rubric": 0.0, "rubric_1": 0.0}],
    ]
    assert out["mixed"][0] == [pytest.approx(0.9), {"rubric_0": 1.0, "rubric_0.rubric": 1.0, "rubric_1": 1.0, "rubric_2": 0.5}]
    # a Sequential stops at its first zero: the parts it did not run are absent, never stale
    assert out["chain"] == [[1.0, {"rubric_0": 1.0, "rubric_1": 1.0}], [0.0, {"rubric_0": 0.0}], [0.0, {"rubric_0": 0.0}]]
    assert out["per_task"][0] == [1.0, {"tasks.math": 1.0}] and out["tasks"] == [0.0, {"tasks.chat": 0.0}]
    assert [r[0] for r in out["Episode"]] == [1.0, 1.0, 1.0]  # a class is built; reset between answers


def test_calls_at_once_on_one_shared_tree_each_see_their_own_parts(side_python, folder):  # noqa: F811
    out = run_script(side_python, SCORE + textwrap.dedent('''
        rubric = load_rubric("mixed", "rubric.py")
        results = {}
        def go(i):
            results[i] = score(rubric, "4" if i % 2 else "5")
        threads = [threading.Thread(target=go, args=(i,)) for i in range(16)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(json.dumps([results[i] for i in range(16)]))
    '''), folder)
    for i, (reward, parts) in enumerate(out):
        right = float(i % 2)
        assert parts == {"rubric_0": right, "rubric_0.rubric": right, "rubric_1": 1.0, "rubric_2": 0.5}
        assert reward == pytest.approx(0.5 * right + 0.3 + 0.1)


def test_openenv_rubrics_are_entries_of_a_composite_and_take_a_config(side_python, folder):  # noqa: F811
    out = run_script(side_python, SCORE + textwrap.dedent('''
        entries = [RubricEntry("quality", load_rubric("weighted", "rubric.py"), 2.0),
                   RubricEntry("length", load_rubric("Scaled", "rubric.py", config={"factor": 0.1}), 1.0)]
        out = score(Rubric.bind(CompositeRubric(entries)), "4")
        try:
            load_rubric("Scaled", "rubric.py")
        except Exception as exc:
            out.append(f"{type(exc).__name__}: {exc}")
        print(json.dumps(out))
    '''), folder)
    assert out[2].startswith("RubricError: OpenEnv rubric Scaled cannot be built without arguments")
    assert out[0] == pytest.approx(2.0 * 1.0 + 0.1)
    assert out[1] == {"quality": 1.0, "quality.rubric_0": 1.0, "quality.rubric_0.rubric": 1.0,
                      "quality.rubric_1": 1.0, "length": pytest.approx(0.1)}


def test_openenv_llm_judge_on_a_loopback_endpoint_is_a_part(side_python, folder):  # noqa: F811
    out = run_script(side_python, SCORE + textwrap.dedent('''
        import asyncio
        from aiohttp import web
        from agilerl.concurrency import LoopThread
        from openenv.core.llm_client import OpenAIClient
        from openenv.core.rubrics import LLMJudge, WeightedSum
        from rubric import Exact

        prompts = []
        async def chat(request):
            body = await request.json()
            prompts.append(body["messages"][-1]["content"])
            return web.json_response({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Score: 0.8"}}]})

        async def start():
            app = web.Application()
            app.router.add_post("/v1/chat/completions", chat)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()  # bound here: no port picked for later
            return runner.addresses[0][1]

        server = LoopThread("stub")
        port = server.run(start())
        judge = LLMJudge("Rate: {action} for {observation}", OpenAIClient("http://127.0.0.1", port, model="m"))
        tree = WeightedSum([judge, Exact()], weights=[0.5, 0.5])
        out["alone"] = score(Rubric.bind(judge), "4")
        out["tree"] = score(Rubric.bind(tree), "4")
        out["prompts"] = prompts
        print(json.dumps(out))
    '''), folder)
    assert out["alone"] == [0.8, {}]
    assert out["tree"] == [pytest.approx(0.9), {"rubric_0": 0.8, "rubric_1": 1.0}]
    assert out["prompts"] == ["Rate: 4 for 2+2?"] * 2  # the observation reads as the question


OWN_RUBRIC_ENV = textwrap.dedent('''
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
    from openenv.core.rubrics import Gate, Rubric, WeightedSum


    class WordAction(Action):
        word: str


    class WordObservation(Observation):
        message: str = ""


    class Right(Rubric):
        def forward(self, action, observation):
            return float(action.word == "kiwi")


    class Brief(Rubric):
        def forward(self, action, observation):
            return float(len(action.word) <= 4)


    class ScoredEnv(Environment):
        """Its reward is its own rubric's, applied in step as RFC 004 shows."""

        def __init__(self):
            super().__init__(rubric=WeightedSum([Gate(Right()), Brief()], weights=[0.8, 0.2]))
            self._state = State(step_count=0)

        def reset(self, seed=None, episode_id=None, **kwargs):
            self._reset_rubric()
            return WordObservation(message="Name a fruit.")

        def step(self, action: WordAction, timeout_s=None, **kwargs):
            observation = WordObservation(message="noted", done=True)
            observation.reward = self._apply_rubric(action, observation)
            return observation

        @property
        def state(self):
            return self._state
''')


def test_an_openenv_envs_own_rubric_reports_its_parts_as_components(side_python, tmp_path):  # noqa: F811
    (tmp_path / "scored.py").write_text(OWN_RUBRIC_ENV)
    out = run_script(side_python, '''
        import json
        from agilerl.envs.openenv_native import adapt_openenv
        from scored import ScoredEnv
        env = adapt_openenv(ScoredEnv)
        out = []
        for word in ("kiwi", "banana"):
            env.reset()
            _, reward, done, _, info = env.step(word)
            out.append([reward, done, info["reward_components"]])
        print(json.dumps(out))
    ''', tmp_path)
    assert out == [
        [1.0, True, {"rubric_0": 1.0, "rubric_0.rubric": 1.0, "rubric_1": 1.0}],
        [0.0, True, {"rubric_0": 0.0, "rubric_0.rubric": 0.0, "rubric_1": 0.0}],
    ]
    check = json.loads(run_agilerl_json(side_python, tmp_path, "scored.py:ScoredEnv"))
    turns = [turn for episode in check["turn_rewards"] for turn in episode]
    assert len(turns) == 1 and all(set(turn["reward_components"]) == {"rubric_0", "rubric_0.rubric", "rubric_1"} for turn in turns)
    from tests.test_openenv_native import run_agilerl

    plain = run_agilerl(side_python, "env", "check", "scored.py:ScoredEnv", "--actions", "kiwi", cwd=tmp_path)
    assert "[turn 1] reward=1 terminated=True truncated=False  rubric_0=1 rubric_0.rubric=1 rubric_1=1" in plain.stdout


def run_agilerl_json(python: Path, cwd: Path, source: str) -> str:
    from tests.test_openenv_native import run_agilerl

    done = run_agilerl(python, "env", "check", source, "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    return done.stdout
