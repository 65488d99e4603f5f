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
    modules = _imported_modules("import agilerl, agilerl.llm_envs")
    assert "agilerl" in modules
    assert not modules & set(HEAVY)


def test_cli_help_imports_no_heavy_library():
    modules = _imported_modules("import sys; sys.argv=['agilerl','--help']\nfrom agilerl.cli.main import main\ntry: main()\nexcept SystemExit: pass")
    assert "argparse" in modules
    assert not modules & set(HEAVY)
