"""`import agilerl` and `agilerl --help` must stay light."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "transformers", "datasets")


def _imported_modules(code: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    names = set()
    for line in result.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def test_import_agilerl_imports_no_heavy_library():
    modules = _imported_modules(
        "import agilerl, agilerl.llm_envs, agilerl.llm_envs.openenv, agilerl.llm_envs.openenv_server, "
        "agilerl.llm_envs.qa_dataset"
    )
    assert "agilerl" in modules
    assert not modules & set(HEAVY)


def test_the_env_side_names_import_no_heavy_library():
    """What ``pip install agilerl-envlayer`` (no extras) promises: protocol, checker, manifest,
    plugins, remote server and client."""
    modules = _imported_modules(
        "from agilerl import hookimpl, TextEnv, check_env, load_manifest, InProcessEnvClient, "
        "RemoteEnvClient, AgileRLError\n"
        "from agilerl.llm_envs import resolve, get_registry, resolve_env, ModelSettings, TrainingSettings"
    )
    assert {"aiohttp", "pydantic"} <= modules
    assert not modules & set(HEAVY)


def test_cli_help_imports_no_heavy_library():
    modules = _imported_modules("import sys; sys.argv=['agilerl','--help']\nfrom agilerl.cli.main import main\ntry: main()\nexcept SystemExit: pass")
    assert "argparse" in modules
    assert not modules & set(HEAVY)
    # nor the event-loop machinery: asyncio alone is a fifth of a cold --help (0.12 s against 0.16 s)
    assert not modules & {"asyncio", "aiohttp", "uvloop"}
