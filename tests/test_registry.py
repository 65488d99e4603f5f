"""The registry: names, lazy targets, resolution errors, plugin selection, failure isolation.

Plugins here are real distributions (dist-info folders on a temp ``sys.path`` entry), found
through real entry-point discovery; nothing is installed into the environment.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from agilerl.errors import LoadError, NameConflict, NameNotRegistered, StrictPluginsError
from agilerl import hookimpl
from agilerl.registry import get_plugin_manager, get_registry, hookspecs, reset_registry, resolve
from agilerl.registry.registry import HOOK_OF_KIND
from agilerl.registry.testing import write_distribution

GOOD = '''
from agilerl import hookimpl

@hookimpl
def register_envs(register):
    register("{env}", "{module}_impl:Env", description="a good env")

@hookimpl
def register_rubrics(register):
    register("{env}-rubric", len)
'''
IMPL = "import sys\nclass Env:\n    pass\n"


def add_plugin(site: Path, ep: str, source: str, *, dist: str | None = None, env: str | None = None) -> None:
    """A distribution ``agilerl-env-<ep>`` whose entry point ``ep`` names module ``plug_<ep>``."""
    module = "plug_" + ep.replace("-", "_")
    files = {
        f"{module}.py": source.format(env=env or ep, module=module),
        f"{module}_impl.py": IMPL,
    }
    write_distribution(site, dist or f"agilerl-env-{ep}", "1.0", files, plugins={ep: module})


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A fresh site folder on sys.path; the registry is rebuilt before and after each test."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("AGILERL_STRICT_PLUGINS", raising=False)
    reset_registry()
    yield site
    reset_registry()
    for name, module in list(sys.modules.items()):  # the next test writes same-named modules
        if str(getattr(module, "__file__", None) or "").startswith(str(site)):
            del sys.modules[name]


def select(monkeypatch, *names: str) -> None:
    monkeypatch.setenv("AGILERL_PLUGINS", ",".join(names))
    reset_registry()


def plugin(name: str):
    return next(p for p in get_registry().plugins if p.name == name)


def test_registered_name_resolves_and_the_target_is_imported_only_on_use(site, monkeypatch):
    add_plugin(site, "good", GOOD)
    select(monkeypatch, "good")
    registry = get_registry()
    assert "plug_good" in sys.modules and "plug_good_impl" not in sys.modules
    entry = registry.get("env", "good")
    assert (entry.description, entry.plugin.distribution, entry.plugin.version) == (
        "a good env",
        "agilerl-env-good",
        "1.0",
    )
    env_class = resolve("env", "good")
    assert env_class.__module__ == "plug_good_impl"
    assert resolve("rubric", "good-rubric") is len
    assert plugin("good").provides == {"env": ["good"], "rubric": ["good-rubric"]}


def test_references_resolve_without_the_registry(tmp_path):
    (tmp_path / "reward.py").write_text("def score(completion):\n    return 1.0\n")
    assert resolve("rubric", "json:loads") is __import__("json").loads
    assert resolve("rubric", "reward.py:score", base_dir=tmp_path)("x") == 1.0


def test_unknown_name_lists_close_matches_and_installed_names(site, monkeypatch):
    add_plugin(site, "good", GOOD, env="guess-the-number")
    select(monkeypatch, "good")
    with pytest.raises(NameNotRegistered) as err:
        resolve("env", "guess-the-numbr")
    message = str(err.value)
    assert "Did you mean 'guess-the-number'?" in message
    with pytest.raises(NameNotRegistered, match=r"Installed envs: colors, guess, guess-the-number\."):  # the built-ins colors and guess too
        resolve("env", "zzzz")  # nothing close: the few installed names are listed
    with pytest.raises(NameNotRegistered, match="is registered, but as another kind: rubric"):
        resolve("env", "guess-the-number-rubric")


def test_plugins_registered_in_process_join_the_registry(site, monkeypatch):
    select(monkeypatch)  # AGILERL_PLUGINS= : no entry points at all
    module = types.ModuleType("inline_plugin")

    @hookimpl
    def register_algorithms(register):
        register("inline-algo", dict, description="in-process")

    module.register_algorithms = register_algorithms
    get_plugin_manager().register(module, name="inline")
    assert resolve("algorithm", "inline-algo") is dict
    assert plugin("inline").distribution is None


def test_agilerl_plugins_selects_entry_points(site, monkeypatch):
    add_plugin(site, "one", GOOD)
    add_plugin(site, "two", GOOD)
    select(monkeypatch, "two")
    assert "two" in get_registry().names("env") and "one" not in get_registry().names("env")
    select(monkeypatch)
    names = {p.name for p in get_registry().plugins}
    assert names == {"agilerl"}  # the built-ins always load
    select(monkeypatch, "two", "three")
    assert "no installed distribution" in plugin("three").error
    assert "two" in plugin("three").error  # lists what is installed


BROKEN = {
    "import-error": "import not_a_real_module_xyz\n",
    "hook-raises": (
        "from agilerl import hookimpl\n"
        "@hookimpl\n"
        "def register_envs(register):\n"
        "    register('half-done', len)\n"
        "    raise RuntimeError('boom in hook')\n"
    ),
    "typo-hook": (
        "from agilerl import hookimpl\n"
        "@hookimpl\n"
        "def register_env(register):\n"
        "    register('never', len)\n"
    ),
    "bad-name": (
        "from agilerl import hookimpl\n"
        "@hookimpl\n"
        "def register_envs(register):\n"
        "    register('Bad Name', len)\n"
    ),
}
CAUSES = {
    "import-error": "import failed: ModuleNotFoundError: No module named 'not_a_real_module_xyz'",
    "hook-raises": "register_envs raised RuntimeError: boom in hook",
    "typo-hook": "unknown hook 'register_env' (did you mean 'register_envs'?)",
    "bad-name": "env name 'Bad Name' is invalid",
}


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_a_broken_plugin_is_recorded_and_the_rest_still_work(site, monkeypatch, broken):
    add_plugin(site, "good", GOOD)
    add_plugin(site, broken, BROKEN[broken])
    select(monkeypatch, "good", broken)
    assert resolve("env", "good").__name__ == "Env"
    info = plugin(broken)
    assert info.status == "error"
    assert CAUSES[broken] in info.error
    assert info.provides == {}  # nothing half-registered
    with pytest.raises(NameNotRegistered, match=re.escape(CAUSES[broken])):
        resolve("env", "half-done")
    monkeypatch.setenv("AGILERL_STRICT_PLUGINS", "1")
    with pytest.raises(StrictPluginsError, match=re.escape(CAUSES[broken])):
        get_registry()


def test_a_name_two_plugins_register_is_a_conflict_naming_both_distributions(site, monkeypatch):
    add_plugin(site, "first", GOOD, env="shared")
    add_plugin(site, "second", GOOD, env="shared")
    add_plugin(site, "good", GOOD)
    select(monkeypatch, "first", "second", "good")
    assert plugin("first").status == plugin("second").status == "conflict"
    assert "agilerl-env-second" in plugin("first").conflicts[0]
    assert resolve("env", "good").__name__ == "Env"
    with pytest.raises(NameConflict) as err:
        resolve("env", "shared")
    assert "agilerl-env-first 1.0" in str(err.value) and "agilerl-env-second 1.0" in str(err.value)
    monkeypatch.setenv("AGILERL_STRICT_PLUGINS", "1")
    with pytest.raises(StrictPluginsError, match="also registered by plugin 'second'"):
        get_registry()


def test_two_distributions_with_one_entry_point_name_are_reported(site, monkeypatch):
    add_plugin(site, "same", GOOD, dist="agilerl-env-alpha", env="alpha")
    write_distribution(site, "agilerl-env-beta", "2.0", plugins={"same": "plug_same"})
    select(monkeypatch, "same")
    infos = [p for p in get_registry().plugins if p.name == "same"]
    assert [p.distribution for p in infos] == ["agilerl-env-alpha", "agilerl-env-beta"]
    assert infos[0].status == "ok" and infos[1].status == "error"
    assert "also used by distribution agilerl-env-alpha" in infos[1].error
    assert "agilerl-env-beta" in infos[1].error
    monkeypatch.setenv("AGILERL_STRICT_PLUGINS", "1")
    with pytest.raises(StrictPluginsError, match="entry-point name 'same'"):
        get_registry()


def test_importing_agilerl_and_agilerl_help_load_no_plugins():
    code = (
        "import sys, agilerl\n"
        "from agilerl.cli.main import build_parser\n"
        "build_parser()\n"
        "assert 'agilerl.registry.plugins' not in sys.modules, 'registry loaded at import'\n"
        "assert 'importlib_metadata' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_hook_has_a_docstring_and_is_documented_with_its_signature():
    docs = (Path(__file__).parents[1] / "docs" / "plugins.md").read_text()
    hooks = [f for name, f in vars(hookspecs).items() if name.startswith("register_")]
    assert len(hooks) == len(HOOK_OF_KIND) and {h.__name__ for h in hooks} == set(HOOK_OF_KIND.values())  # one hook per kind
    for hook in hooks:
        assert hook.__doc__
        assert f"{hook.__name__}(register)" in docs
        assert list(inspect.signature(hook).parameters) == ["register"]


def test_load_errors_stay_agilerl_errors():
    with pytest.raises(LoadError, match="cannot import module 'no_such_mod_abc'"):
        resolve("env", "no_such_mod_abc:Env")


@pytest.mark.parametrize("kind", sorted(HOOK_OF_KIND))
def test_every_hook_registers_names_of_its_kind(site, monkeypatch, kind):
    select(monkeypatch)
    module = types.ModuleType(f"plugin_for_{kind}")

    def hook(register):
        register(f"my-{kind}", "json:dumps", description=kind)

    setattr(module, HOOK_OF_KIND[kind], hookimpl(hook))
    get_plugin_manager().register(module, name=f"for-{kind}")
    assert resolve(kind, f"my-{kind}") is __import__("json").dumps
    assert plugin(f"for-{kind}").provides == {kind: [f"my-{kind}"]}
    other = next(k for k in HOOK_OF_KIND if k != kind)
    with pytest.raises(NameNotRegistered):
        resolve(other, f"my-{kind}")
