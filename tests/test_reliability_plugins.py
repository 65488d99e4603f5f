"""Plugins that name things badly, write to file descriptor 1, or are slow: real plugin
distributions (a site folder laid out as pip leaves it, selected with AGILERL_PLUGINS), as in
tests/test_faults_plugins.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agilerl.registry.testing import write_distribution

HOOK = "from agilerl import hookimpl\n@hookimpl\ndef register_envs(register):\n"
# Each of the three waits at import, and again in its hook, until all three got there: loaded one
# after another, the first waits alone and fails (BrokenBarrierError), so they all load only when
# loaded at once. A module of their own holds the barriers.
BARRIERS = "import threading\nat_import = threading.Barrier(3, timeout=30)\nin_hook = threading.Barrier(3, timeout=30)\n"
# The first discovered finishes last (it sleeps longest), so finishing order is not discovery order.
MEETS = (
    "import time, importlib_metadata, slow_meet\n"
    "found = [e.name for e in importlib_metadata.entry_points(group='agilerl.plugins') if e.name.startswith('slow-')]\n"
    "time.sleep(0.3 * (len(found) - found.index('{name}')))\n"
    "slow_meet.at_import.wait()\n" + HOOK + "    slow_meet.in_hook.wait()\n    register('{name}-env', 'x:y')\n"
)
PLUGINS = {
    "good": HOOK + "    register('good-env', 'x:y')\n",
    "long-name": HOOK + "    register('a' * 10_000, 'x:y')\n",
    "nul-name": HOOK + "    register('bad\\x00name', 'x:y')\n",
    "fd-writes": "import os\nos.write(1, b'fd write at import\\n')\n" + HOOK
    + "    os.write(1, b'fd write in the hook\\n')\n    register('fd-env', 'x:y')\n",
    "fd-hangs": "import os, time\nwhile True:\n    os.write(1, b'fd write while hung\\n')\n    time.sleep(0.01)\n",
    **{name: MEETS.format(name=name) for name in ("slow-a", "slow-b", "slow-c")},
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    (site / "slow_meet.py").write_text(BARRIERS)
    for name, source in PLUGINS.items():
        module = "rel_" + name.replace("-", "_")
        write_distribution(site, f"agilerl-env-rel-{name}", "1.0", {f"{module}/__init__.py": source}, plugins={name: module})
    long_module = "rel_long_entry_point"
    write_distribution(site, "agilerl-env-rel-long-entry-point", "1.0", {f"{long_module}/__init__.py": ""},
                       plugins={"e" * 300: long_module})
    return site


def agilerl(site: Path, plugins: str, *args: str, timeout_s: str = "60") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGILERL_")}
    env.update(PYTHONPATH=str(site), AGILERL_PLUGINS=plugins, AGILERL_PLUGIN_TIMEOUT=timeout_s)
    return subprocess.run(
        [sys.executable, "-m", "agilerl", *args], capture_output=True, text=True, env=env, timeout=300
    )


def rows(result: subprocess.CompletedProcess[str]) -> dict[str, tuple[str, str | None]]:
    assert result.returncode == 0, result.stderr
    return {row["name"]: (row["status"], row["error"]) for row in json.loads(result.stdout)}


def test_a_name_past_the_rule_is_that_plugins_error(site: Path) -> None:
    listed = rows(agilerl(site, "good,long-name,nul-name," + "e" * 300, "plugins", "list", "--json"))
    assert listed["good"] == ("ok", None)
    status, error = listed["long-name"]
    assert status == "error" and error is not None
    assert error.startswith("register_envs raised RegistrationError: env name 'aaaaaaaaaa")
    assert error.endswith("is 10,000 characters long; names are at most 128.")
    assert len(error) < 300  # the name is cut, not listed whole
    assert listed["nul-name"][0] == "error" and "env name 'bad\\x00name' is invalid" in listed["nul-name"][1]
    long_entry_point = next(name for name in listed if name.startswith("'eeee"))
    assert listed[long_entry_point] == (
        "error", f"entry-point name {long_entry_point} is 300 characters long; names are 1 to 128; rename it."
    )
    envs = agilerl(site, "good,long-name,nul-name", "envs", "list", "--json")
    assert {row["name"] for row in json.loads(envs.stdout) if row["plugin"] != "agilerl"} == {"good-env"}


def test_writes_to_fd_1_at_import_or_in_a_hook_do_not_reach_stdout(site: Path) -> None:
    result = agilerl(site, "good,fd-writes,fd-hangs", "plugins", "list", "--json", timeout_s="1")
    listed = rows(result)  # stdout is the JSON alone
    assert listed["fd-writes"] == ("ok", None)
    assert listed["fd-hangs"] == ("error", "import did not finish within 1 s (AGILERL_PLUGIN_TIMEOUT); skipped")
    assert "fd write at import" in result.stderr and "fd write in the hook" in result.stderr
    assert "fd write while hung" in result.stderr and "fd write" not in result.stdout  # after its deadline too


def test_slow_plugins_load_at_once_and_keep_their_order(site: Path) -> None:
    listed = rows(agilerl(site, "slow-a,slow-b,slow-c", "plugins", "list", "--json"))
    assert [listed[name] for name in ("slow-a", "slow-b", "slow-c")] == [("ok", None)] * 3
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGILERL_")}
    env.update(PYTHONPATH=str(site), AGILERL_PLUGINS="slow-a,slow-b,slow-c", AGILERL_PLUGIN_TIMEOUT="60")
    order = subprocess.run(
        [sys.executable, "-c", "import json, importlib_metadata as m; from agilerl.registry import get_registry; "
         "r = get_registry(); print(json.dumps([[e.name for e in m.entry_points(group='agilerl.plugins') "
         "if e.name.startswith('slow-')], [p.name for p in r.plugins if p.name.startswith('slow-')], "
         "[e.plugin.name for e in r.entries('env') if e.name.startswith('slow-')]]))"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert order.returncode == 0, order.stderr
    discovered, plugins, owners = json.loads(order.stdout)
    assert plugins == discovered  # the order they were found in, not the order they finished in
    assert owners == ["slow-a", "slow-b", "slow-c"]  # one env each (entries are listed by name)


def test_plugin_code_on_several_threads_shares_one_redirection_and_fd_1_comes_back(
    capfd: pytest.CaptureFixture[str],
) -> None:
    import threading

    from agilerl.registry.plugins import call_plugin_codes

    def writes(tag: bytes) -> None:
        os.write(1, tag)
        print(tag.decode(), end="")

    started = threading.Barrier(2, timeout=30)

    def batch(tag: bytes) -> None:
        started.wait()
        outcomes = call_plugin_codes([lambda: writes(tag), lambda: writes(tag.upper())], deadlines=[True, True])
        assert [o.error for o in outcomes] == [None, None]

    callers = [threading.Thread(target=batch, args=(tag,)) for tag in (b"<a>", b"<b>")]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(60)
    os.write(1, b"after")
    out, err = capfd.readouterr()
    assert out == "after"  # fd 1 is stdout again once the last batch is done
    assert sorted(err.replace("><", "> <").split()) == sorted(["<a>", "<a>", "<A>", "<A>", "<b>", "<b>", "<B>", "<B>"])
