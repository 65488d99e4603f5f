"""Hostile plugins cannot hold or end the CLI: real plugin distributions (a site folder laid out
as pip leaves it, selected with AGILERL_PLUGINS) that hang, print, exit or register 10,000 names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agilerl.registry.testing import write_distribution

HOOK = "from agilerl import hookimpl\n@hookimpl\ndef register_envs(register):\n"
PLUGINS = {
    "good": HOOK + "    register('good-env', 'fault_good.env:Env')\n",
    "sleeps": "import time\ntime.sleep(600)\n",
    "spins": "while True:\n    pass\n",
    "hangs-printing": "import time\nwhile True:\n    print('still here', flush=True)\n    time.sleep(0.01)\n",
    "hook-sleeps": HOOK + "    import time\n    time.sleep(600)\n",
    "prints": "print('printed at import')\n" + HOOK + "    print('printed in the hook')\n    register('loud', 'x:y')\n",
    "exits-at-import": "raise SystemExit(3)\n",
    "exits-in-hook": HOOK + "    raise SystemExit(3)\n",
    "base-exception": "class Odd(BaseException):\n    pass\nraise Odd('not an Exception')\n",
    "many": HOOK + "    for i in range(10_000):\n        register(f'many/{i}', 'fault_many.env:Env')\n",
    "env-exits": HOOK + "    register('exiting-env', 'fault_env_exits.env:Env')\n",
}
EXTRA_FILES = {"env-exits": {"env.py": "raise SystemExit(3)\n"}}
GUESS_MANIFEST = "environment:\n  env_type: rollout\n  entrypoint: guess\n"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    for name, source in PLUGINS.items():
        module = "fault_" + name.replace("-", "_")
        files = {f"{module}/__init__.py": source, **{f"{module}/{k}": v for k, v in EXTRA_FILES.get(name, {}).items()}}
        write_distribution(site, f"agilerl-env-fault-{name}", "1.0", files, plugins={name: module})
    return site


def agilerl(site: Path, plugins: str, *args: str, timeout_s: str = "1") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGILERL_")}
    env.update(PYTHONPATH=str(site), AGILERL_PLUGINS=plugins, AGILERL_PLUGIN_TIMEOUT=timeout_s)
    return subprocess.run(
        [sys.executable, "-m", "agilerl", *args], capture_output=True, text=True, env=env, timeout=300
    )


def statuses(result: subprocess.CompletedProcess[str]) -> dict[str, tuple[str, str | None]]:
    assert result.returncode == 0, result.stderr
    return {row["name"]: (row["status"], row["error"]) for row in json.loads(result.stdout)}


def test_a_plugin_that_hangs_at_import_or_in_a_hook_is_skipped_by_name_and_the_rest_load(site):
    result = agilerl(site, "good,sleeps,spins,hook-sleeps", "plugins", "list", "--json")
    rows = statuses(result)
    assert rows["good"] == ("ok", None)
    assert rows["sleeps"] == ("error", "import did not finish within 1 s (AGILERL_PLUGIN_TIMEOUT); skipped")
    assert rows["spins"][1] == rows["sleeps"][1]
    assert rows["hook-sleeps"] == ("error", "register_envs did not finish within 1 s (AGILERL_PLUGIN_TIMEOUT); skipped")
    for name in ("sleeps", "spins", "hook-sleeps"):
        assert f"warning: plugin {name!r} (distribution agilerl-env-fault-{name} 1.0)" in result.stderr


def test_a_command_that_does_not_need_the_hung_plugin_goes_on(site, tmp_path):
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(GUESS_MANIFEST)
    result = agilerl(site, "sleeps", "manifest", "validate", str(manifest))
    assert result.returncode == 0, result.stderr
    assert "entrypoint: guess" in result.stdout
    assert "plugin 'sleeps'" in result.stderr


def test_output_printed_by_a_plugin_goes_to_stderr_and_the_json_stays_clean(site):
    result = agilerl(site, "prints,hangs-printing", "plugins", "list", "--json")
    assert statuses(result)["prints"] == ("ok", None)  # stdout parsed as JSON
    assert "still here" in result.stderr and "still here" not in result.stdout  # even after its deadline
    assert "printed at import" in result.stderr and "printed in the hook" in result.stderr


def test_system_exit_and_other_base_exceptions_are_contained_like_any_plugin_error(site, tmp_path):
    rows = statuses(agilerl(site, "good,exits-at-import,exits-in-hook,base-exception", "plugins", "list", "--json"))
    assert rows["exits-at-import"] == ("error", "import failed: SystemExit: 3")
    assert rows["exits-in-hook"] == ("error", "register_envs raised SystemExit: 3")
    assert rows["base-exception"] == ("error", "import failed: Odd: not an Exception")
    assert rows["good"] == ("ok", None)
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(GUESS_MANIFEST)
    validated = agilerl(site, "exits-at-import,exits-in-hook", "manifest", "validate", str(manifest))
    assert validated.returncode == 0, validated.stderr


def test_ten_thousand_names_are_all_listed(site):
    result = agilerl(site, "many", "envs", "list", "--json", timeout_s="0")
    names = {row["name"] for row in json.loads(result.stdout) if row["plugin"] == "many"}
    assert names == {f"many/{i}" for i in range(10_000)}


@pytest.mark.parametrize("value", ["soon", "-1", "inf"])
def test_a_bad_plugin_timeout_is_a_user_error(site, value):
    result = agilerl(site, "good", "plugins", "list", timeout_s=value)
    assert result.returncode == 2
    assert f"AGILERL_PLUGIN_TIMEOUT={value!r} is not a number of seconds" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_registered_env_whose_module_exits_when_first_used_is_a_user_error(site):
    result = agilerl(site, "env-exits", "env", "check", "exiting-env")
    assert result.returncode == 2, result.stderr
    assert "importing 'fault_env_exits.env:Env' raised SystemExit(3)" in result.stderr
