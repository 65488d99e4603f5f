"""``env_packages``: real uv installs of real local wheels into this interpreter.

Wheels are built in the test into a folder uv reads as its only package source
(``UV_NO_INDEX=1``, ``UV_FIND_LINKS=<folder>``); every install is uninstalled afterwards.
"""

from __future__ import annotations

import subprocess
import sys

import importlib_metadata
import pytest

from agilerl.manifest.spec import ManifestError, parse_env_spec
from agilerl.llm_envs import RolloutHarness
from agilerl.registry import reset_registry, resolve
from agilerl.registry.install import (
    EnvPackagesError,
    install_packages,
    pip_index_options,
    uv_binary,
)
from agilerl.registry.testing import build_wheel

ENV_CODE = """
class Env:
    max_turns = 1

    def reset(self, seed=None):
        return "Say hi.", {}

    def step(self, action):
        return "", float(action == "hi"), True, False, {}
"""
PREFIX = "agilerl-pkgtest-"


def uv_pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [uv_binary(), "pip", *args, "--python", sys.executable], capture_output=True, text=True, check=True
    )


def pip_freeze() -> str:
    return subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout


def installed_test_packages() -> list[str]:
    return sorted(line for line in uv_pip("freeze").stdout.splitlines() if line.startswith(PREFIX))


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wheels")
    build_wheel(folder, PREFIX + "env", "1.0", {"agilerl_pkgtest_env.py": ENV_CODE})
    build_wheel(folder, PREFIX + "dep", "1.0", {"agilerl_pkgtest_dep.py": ""})
    build_wheel(folder, PREFIX + "dep", "2.0", {"agilerl_pkgtest_dep.py": ""})
    build_wheel(
        folder, PREFIX + "needs-dep2", "1.0", {"agilerl_pkgtest_needs_dep2.py": ENV_CODE},
        requires=[PREFIX + "dep>=2"],
    )
    build_wheel(
        folder, PREFIX + "plugin", "1.0",
        {
            "agilerl_pkgtest_plugin.py": (
                "from agilerl import hookimpl\n@hookimpl\ndef register_envs(register):\n"
                "    register('pkgtest-env', 'agilerl_pkgtest_plugin:Env')\n" + ENV_CODE
            )
        },
        plugins={"pkgtest": "agilerl_pkgtest_plugin"},
    )
    return folder


@pytest.fixture
def local_index(wheels, monkeypatch):
    """uv sees only the test's wheels; whatever a test installs is removed afterwards."""
    monkeypatch.setenv("UV_NO_INDEX", "1")
    monkeypatch.setenv("UV_FIND_LINKS", str(wheels))
    monkeypatch.delenv("AGILERL_PLUGINS", raising=False)
    assert installed_test_packages() == []
    yield
    leftovers = [line.split("==")[0] for line in installed_test_packages()]
    if leftovers:
        uv_pip("uninstall", *leftovers)
    for name in [m for m in sys.modules if m.startswith("agilerl_pkgtest_")]:
        del sys.modules[name]
    reset_registry()


def test_a_missing_module_is_installed_then_imported(local_index):
    env_class = resolve("env", "agilerl_pkgtest_env:Env", install=[PREFIX + "env"])
    assert env_class.max_turns == 1
    assert importlib_metadata.version(PREFIX + "env") == "1.0"


def test_a_manifest_with_pip_env_packages_installs_with_uv_on_first_use(local_index, chatml_tokenizer):
    spec = parse_env_spec(
        {"env_type": "rollout", "entrypoint": "agilerl_pkgtest_env:Env", "env_packages": {"pip": [PREFIX + "env"]}}
    )
    harness = RolloutHarness.from_spec(spec, chatml_tokenizer)
    harness.reset(seed=0)
    assert harness.step("hi")[1:3] == (1.0, True)
    assert importlib_metadata.distribution(PREFIX + "env").read_text("INSTALLER").strip() == "uv"


def test_an_unregistered_name_is_installed_as_a_plugin_then_found(local_index):
    env_class = resolve("env", "pkgtest-env", install=[PREFIX + "plugin"])
    assert env_class.__module__ == "agilerl_pkgtest_plugin"


def test_nothing_is_installed_when_the_entrypoint_imports(local_index):
    # The package does not exist anywhere: any install attempt would fail.
    assert resolve("env", "json:loads", install=[PREFIX + "does-not-exist"]) is __import__("json").loads
    assert installed_test_packages() == []


def test_a_package_that_would_change_an_installed_distribution_fails_cleanly(local_index, wheels):
    install_packages([PREFIX + "dep==1.0"])
    before = pip_freeze()
    # Without the constraints uv would happily upgrade dep to 2.0: the conflict is the pin.
    dry_run = subprocess.run(
        [uv_binary(), "pip", "install", "--dry-run", "--python", sys.executable, PREFIX + "needs-dep2"],
        capture_output=True, text=True, check=False,
    )
    assert dry_run.returncode == 0 and "dep==2.0" in dry_run.stderr
    with pytest.raises(EnvPackagesError) as err:
        resolve("env", "agilerl_pkgtest_needs_dep2:Env", install=[PREFIX + "needs-dep2"])
    message = str(err.value)
    assert "cannot be installed alongside the trainer" in message
    assert "env_url" in message and "resolve_env" in message
    assert PREFIX + "dep" in message  # uv's own explanation is kept
    assert pip_freeze() == before


@pytest.mark.parametrize("bad", ["-e", "--index-url=https://example.invalid/simple", " -r req.txt"])
def test_options_are_rejected_before_uv_runs(bad):
    with pytest.raises(EnvPackagesError, match="options such as '-e'"):
        install_packages(["requests", bad])
    with pytest.raises(ManifestError, match="options such as '-e'"):
        parse_env_spec({"env_type": "rollout", "entrypoint": "x:y", "env_packages": {"uv": [bad]}})


def test_pip_configuration_is_passed_to_uv_unless_uv_settings_override_it(monkeypatch):
    monkeypatch.delenv("UV_FIND_LINKS", raising=False)
    monkeypatch.setenv("PIP_FIND_LINKS", "/srv/test-wheels")
    options = pip_index_options()
    assert options[options.index("--find-links") + 1] == "/srv/test-wheels"
    monkeypatch.setenv("UV_FIND_LINKS", "/elsewhere")
    assert "--find-links" not in pip_index_options()
