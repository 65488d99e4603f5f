"""Plugins end to end through the ``agilerl`` command: real distributions, real pip installs
(into a throwaway venv, never into the interpreter running the suite)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agilerl.cli.main import main
from agilerl.registry.testing import build_wheel, write_distribution

ENV_MODULE = '''
class CountdownEnv:
    """Say the number shown; the count goes down by one each turn."""

    max_turns = 3

    def __init__(self, start=3):
        self.start = start

    def reset(self, seed=None):
        self.n = self.start
        return f"Say {self.n}.", {}

    def step(self, action):
        correct = action.strip() == str(self.n)
        self.n -= 1
        return f"Say {self.n}.", float(correct), self.n == 0, False, {}
'''
PLUGIN_MODULE = '''
from agilerl import hookimpl

@hookimpl
def register_envs(register):
    register("{env}", "{module}.env:CountdownEnv", description="count down")
'''


def plugin_files(module: str, env: str) -> dict[str, str]:
    return {
        f"{module}/__init__.py": PLUGIN_MODULE.format(module=module, env=env),
        f"{module}/env.py": ENV_MODULE,
    }


def agilerl(
    *args: str, env: dict[str, str] | None = None, check: bool = True, python: str | Path = sys.executable
) -> subprocess.CompletedProcess:
    """Run the real ``agilerl`` command in a fresh interpreter (cold plugin discovery)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AGILERL_")}
    full_env.update(COLUMNS="400", **(env or {}))
    result = subprocess.run(
        [str(python), "-m", "agilerl", *args], capture_output=True, text=True, env=full_env, check=False
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


BROKEN_SOURCES = {
    "import-error": "import not_a_real_module_xyz\n",
    "hook-raises": (
        "from agilerl import hookimpl\n@hookimpl\ndef register_envs(register):\n"
        "    raise RuntimeError('boom in hook')\n"
    ),
    "typo-hook": (
        "from agilerl import hookimpl\n@hookimpl\ndef register_env(register):\n    pass\n"
    ),
}


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory):
    """One good plugin, three broken ones, a name conflict and a duplicate entry-point name."""
    site = tmp_path_factory.mktemp("site")
    write_distribution(site, "agilerl-env-good", "1.0", plugin_files("cli_good", "good-env"), plugins={"good": "cli_good"})
    for name, source in BROKEN_SOURCES.items():
        module = "cli_" + name.replace("-", "_")
        write_distribution(site, f"agilerl-env-{name}", "1.0", {f"{module}.py": source}, plugins={name: module})
    for clash in ("a", "b"):
        write_distribution(
            site, f"agilerl-env-clash-{clash}", "1.0", plugin_files(f"cli_clash_{clash}", "clash"),
            plugins={f"clash-{clash}": f"cli_clash_{clash}"},
        )
    write_distribution(site, "agilerl-env-good-twin", "2.0", plugins={"good": "cli_good"})
    return site


EXPECTED_STATUS = {
    "good": ("ok", None),
    "import-error": ("error", "No module named 'not_a_real_module_xyz'"),
    "hook-raises": ("error", "register_envs raised RuntimeError: boom in hook"),
    "typo-hook": ("error", "unknown hook 'register_env'"),
    "clash-a": ("conflict", "env 'clash' also registered by plugin 'clash-b'"),
    "clash-b": ("conflict", "(distribution agilerl-env-clash-a 1.0)"),
}


def test_plugins_list_shows_every_broken_plugin_and_still_lists_the_rest(broken_site):
    env = {"PYTHONPATH": str(broken_site), "AGILERL_PLUGINS": ",".join([*EXPECTED_STATUS])}
    rows = json.loads(agilerl("plugins", "list", "--json", env=env).stdout)
    by_name = {}
    for row in rows:
        by_name.setdefault(row["name"], []).append(row)
    for name, (status, cause) in EXPECTED_STATUS.items():
        row = by_name[name][0]
        assert row["status"] == status, row
        if cause:
            assert cause in (row["error"] or "") + " ".join(row["conflicts"])
    assert by_name["good"][0]["provides"] == {"env": ["good-env"]}
    twin = by_name["good"][1]
    assert (twin["distribution"], twin["status"]) == ("agilerl-env-good-twin", "error")
    assert "also used by distribution agilerl-env-good" in twin["error"]

    table = agilerl("plugins", "list", env=env).stdout
    assert "error: import failed: ModuleNotFoundError" in table
    assert "conflict: env 'clash'" in table
    assert "env: good-env" in table

    envs = json.loads(agilerl("envs", "list", "--json", env=env).stdout)
    good = next(e for e in envs if e["name"] == "good-env")
    assert (good["plugin"], good["distribution"], good["description"]) == ("good", "agilerl-env-good", "count down")
    assert [e["conflict"] for e in envs if e["name"] == "clash"] == [True, True]


@pytest.mark.parametrize("name", ["import-error", "hook-raises", "typo-hook", "clash-a"])
def test_strict_plugins_turns_the_cause_into_a_failure(broken_site, name):
    selected = f"good,{name},clash-b" if name == "clash-a" else f"good,{name}"
    env = {"PYTHONPATH": str(broken_site), "AGILERL_PLUGINS": selected, "AGILERL_STRICT_PLUGINS": "1"}
    result = agilerl("plugins", "list", env=env, check=False)
    assert result.returncode == 2
    assert EXPECTED_STATUS[name][1] in result.stderr
    assert "Traceback" not in result.stderr


def test_a_pip_installed_plugin_is_listed_runs_from_a_manifest_and_goes_away_when_uninstalled(
    tmp_path, throwaway_venv
):
    wheel = build_wheel(
        tmp_path, "agilerl-env-throwaway", "0.3", plugin_files("agilerl_env_throwaway", "throwaway/countdown"),
        plugins={"throwaway": "agilerl_env_throwaway"},
    )
    throwaway_venv.pip("install", "--no-deps", str(wheel))
    rows = json.loads(agilerl("plugins", "list", "--json", python=throwaway_venv.python).stdout)
    row = next(r for r in rows if r["name"] == "throwaway")
    assert (row["version"], row["status"], row["provides"]) == ("0.3", "ok", {"env": ["throwaway/countdown"]})

    steps = throwaway_venv.script(
        f"""
        import json
        from agilerl.train.tiny_model import build_tiny_tokenizer
        from agilerl.llm_envs import RolloutHarness
        from agilerl.manifest.spec import parse_env_spec

        spec = parse_env_spec(
            {{"env_type": "rollout", "entrypoint": "throwaway/countdown", "env_config": {{"start": 2}}}}
        )
        harness = RolloutHarness.from_spec(spec, build_tiny_tokenizer("chatml"), base_dir={str(tmp_path)!r})
        harness.reset(seed=0)
        steps = [harness.step("2")[1:3], harness.step("1")[1:3]]
        harness.close()
        print(json.dumps(steps))
        """
    )
    assert steps == [[1.0, False], [1.0, True]]  # (reward, terminated) of each step

    throwaway_venv.pip("uninstall", "-y", "agilerl-env-throwaway")
    rows = json.loads(agilerl("plugins", "list", "--json", python=throwaway_venv.python).stdout)
    assert "throwaway" not in {r["name"] for r in rows}


def test_plugins_new_scaffolds_a_package_that_passes_its_own_tests(tmp_path, capsys, throwaway_venv):
    assert main(["plugins", "new", "demo", "--dir", str(tmp_path)]) == 0
    package = tmp_path / "agilerl-env-demo"
    assert sorted(p.relative_to(package).as_posix() for p in package.rglob("*") if p.is_file()) == [
        "README.md",
        "agilerl_env_demo/__init__.py",
        "agilerl_env_demo/env.py",
        "pyproject.toml",
        "tests/test_env.py",
    ]
    assert main(["plugins", "new", "demo", "--dir", str(tmp_path)]) == 2  # never overwrites
    assert "already exists" in capsys.readouterr().err
    throwaway_venv.pip("install", "--no-deps", "--no-build-isolation", "-e", str(package))
    tests = throwaway_venv.run(
        "-m", "pytest", "-q", "-p", "no:cacheprovider", str(package / "tests"), cwd=package, check=False
    )
    assert tests.returncode == 0, tests.stdout + tests.stderr
    count = (package / "tests" / "test_env.py").read_text().count("\ndef test_")
    assert count >= 2 and f"{count} passed" in tests.stdout
    rows = json.loads(agilerl("plugins", "list", "--json", python=throwaway_venv.python).stdout)
    row = next(r for r in rows if r["name"] == "demo")
    assert (row["distribution"], row["provides"]) == ("agilerl-env-demo", {"env": ["demo"]})


def test_plugins_new_rejects_a_bad_name(tmp_path, capsys):
    assert main(["plugins", "new", "Bad_Name", "--dir", str(tmp_path)]) == 2
    assert "plugin name 'Bad_Name' is invalid" in capsys.readouterr().err
    assert not any(Path(tmp_path).iterdir())
