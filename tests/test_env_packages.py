"""``env_packages``: real uv installs of real local wheels, into a throwaway venv.

The code under test installs into the environment of the interpreter it runs in, so every
install runs in a subprocess with a throwaway venv's python (``throwaway_venv`` in conftest.py:
it sees this interpreter's packages, and nothing is ever installed into this interpreter).
Wheels are built in the test into a folder uv reads as its only package source
(``UV_NO_INDEX=1``, ``UV_FIND_LINKS=<folder>``).
"""

from __future__ import annotations

import subprocess

import pytest

from agilerl.errors import ConfigError, EnvPackagesError
from agilerl.manifest.spec import parse_env_spec
from agilerl.registry.install import install_packages, pip_index_options, uv_binary
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


def uv_pip(venv, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [uv_binary(), "pip", *args, "--python", str(venv.python)], capture_output=True, text=True, check=True
    )


def pip_freeze(venv) -> str:
    """Every distribution the venv's python sees: its own and the suite's."""
    return venv.run("-m", "pip", "freeze").stdout


def installed_test_packages(venv) -> list[str]:
    return sorted(line for line in uv_pip(venv, "freeze").stdout.splitlines() if line.startswith(PREFIX))


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
def local_index(wheels, monkeypatch, throwaway_venv):
    """A throwaway venv with none of the test packages, where uv sees only the test's wheels."""
    monkeypatch.setenv("UV_NO_INDEX", "1")
    monkeypatch.setenv("UV_FIND_LINKS", str(wheels))
    monkeypatch.delenv("AGILERL_PLUGINS", raising=False)
    assert installed_test_packages(throwaway_venv) == []
    return throwaway_venv


def test_a_missing_module_is_installed_then_imported(local_index):
    max_turns, version = local_index.script(
        f"""
        import json
        import importlib_metadata
        from agilerl.registry import resolve

        env_class = resolve("env", "agilerl_pkgtest_env:Env", install=[{PREFIX + "env"!r}])
        print(json.dumps([env_class.max_turns, importlib_metadata.version({PREFIX + "env"!r})]))
        """
    )
    assert (max_turns, version) == (1, "1.0")
    assert installed_test_packages(local_index) == [PREFIX + "env==1.0"]


def test_a_manifest_with_pip_env_packages_installs_with_uv_on_first_use(local_index):
    step, installer = local_index.script(
        f"""
        import json
        import importlib_metadata
        from agilerl.train.tiny_model import build_tiny_tokenizer
        from agilerl.llm_envs import RolloutHarness
        from agilerl.manifest.spec import parse_env_spec

        spec = parse_env_spec(
            {{"env_type": "rollout", "entrypoint": "agilerl_pkgtest_env:Env",
              "env_packages": {{"pip": [{PREFIX + "env"!r}]}}}}
        )
        harness = RolloutHarness.from_spec(spec, build_tiny_tokenizer("chatml"))
        harness.reset(seed=0)
        step = harness.step("hi")[1:3]
        installer = importlib_metadata.distribution({PREFIX + "env"!r}).read_text("INSTALLER").strip()
        print(json.dumps([step, installer]))
        """
    )
    assert step == [1.0, True]
    assert installer == "uv"


def test_an_unregistered_name_is_installed_as_a_plugin_then_found(local_index):
    module = local_index.script(
        f"""
        import json
        from agilerl.registry import resolve

        env_class = resolve("env", "pkgtest-env", install=[{PREFIX + "plugin"!r}])
        print(json.dumps(env_class.__module__))
        """
    )
    assert module == "agilerl_pkgtest_plugin"


def test_nothing_is_installed_when_the_entrypoint_imports(local_index):
    # The package does not exist anywhere: any install attempt would fail.
    found_json_loads = local_index.script(
        f"""
        import json
        from agilerl.registry import resolve

        print(json.dumps(resolve("env", "json:loads", install=[{PREFIX + "does-not-exist"!r}]) is json.loads))
        """
    )
    assert found_json_loads is True
    assert installed_test_packages(local_index) == []


def test_a_package_that_would_change_an_installed_distribution_fails_cleanly(local_index):
    local_index.script(
        f"""
        from agilerl.registry.install import install_packages

        install_packages([{PREFIX + "dep==1.0"!r}])
        print("null")
        """
    )
    assert installed_test_packages(local_index) == [PREFIX + "dep==1.0"]
    before = pip_freeze(local_index)
    # Without the constraints uv would happily upgrade dep to 2.0: the conflict is the pin.
    dry_run = subprocess.run(
        [uv_binary(), "pip", "install", "--dry-run", "--python", str(local_index.python), PREFIX + "needs-dep2"],
        capture_output=True, text=True, check=False,
    )
    assert dry_run.returncode == 0 and "dep==2.0" in dry_run.stderr
    raised, message = local_index.script(
        f"""
        import json
        from agilerl.errors import EnvPackagesError
        from agilerl.registry import resolve

        try:
            resolve("env", "agilerl_pkgtest_needs_dep2:Env", install=[{PREFIX + "needs-dep2"!r}])
        except EnvPackagesError as err:
            print(json.dumps([True, str(err)]))
        else:
            print(json.dumps([False, ""]))
        """
    )
    assert raised, "resolve did not raise EnvPackagesError"
    assert "need versions of packages the trainer already has installed" in message
    assert "env_url" in message and "agilerl serve" in message
    assert PREFIX + "dep" in message  # uv's own explanation is kept
    assert pip_freeze(local_index) == before


@pytest.mark.parametrize("bad", ["-e", "--index-url=https://example.invalid/simple", " -r req.txt"])
def test_options_are_rejected_before_uv_runs(bad):
    with pytest.raises(EnvPackagesError, match="options such as '-e'"):
        install_packages(["requests", bad])
    with pytest.raises(ConfigError, match="options such as '-e'"):
        parse_env_spec({"env_type": "rollout", "entrypoint": "x:y", "env_packages": {"uv": [bad]}})


def test_pip_configuration_is_passed_to_uv_unless_uv_settings_override_it(monkeypatch):
    monkeypatch.delenv("UV_FIND_LINKS", raising=False)
    monkeypatch.setenv("PIP_FIND_LINKS", "/srv/test-wheels")
    options = pip_index_options()
    assert options[options.index("--find-links") + 1] == "/srv/test-wheels"
    monkeypatch.setenv("UV_FIND_LINKS", "/elsewhere")
    assert "--find-links" not in pip_index_options()


def test_uv_merges_pip_extra_indexes_like_pip_unless_told_otherwise(monkeypatch):
    from agilerl.registry.install import pip_index_options

    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://example.invalid/torch-wheels")
    monkeypatch.delenv("UV_INDEX_STRATEGY", raising=False)
    options = pip_index_options()
    assert "https://example.invalid/torch-wheels" in options
    assert options[-2:] == ["--index-strategy", "unsafe-best-match"]  # pip's merge: best version anywhere
    monkeypatch.setenv("UV_INDEX_STRATEGY", "first-index")
    assert "--index-strategy" not in pip_index_options()
