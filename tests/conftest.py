"""Shared fixtures: the tiny offline tokenizers and model every test uses, and throwaway venvs
for tests that install packages."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agilerl.registry.testing import overlay_venv, site_dirs


@pytest.fixture(scope="session")
def chatml_tokenizer():
    from agilerl.train.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer("chatml")


@pytest.fixture(scope="session")
def llama3_tokenizer():
    from agilerl.train.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer("llama3")


@pytest.fixture(scope="session")
def tiny_model(chatml_tokenizer):
    from agilerl.train.tiny_model import build_tiny_model

    return build_tiny_model(chatml_tokenizer)


class ThrowawayVenv:
    """A venv in a temp folder that sees the running interpreter's packages and installs into
    its own ``site-packages`` only: tests install real packages there, never into the
    interpreter running the suite.

    Built by ``agilerl.registry.testing.overlay_venv``: nothing is reinstalled, and
    ``python -m pip`` / ``python -m agilerl`` work in it.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.python, self.site_packages = overlay_venv(root)

    def run(
        self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        """``python *args`` with this venv's interpreter; ``check`` asserts exit 0 with its output."""
        result = subprocess.run(
            [str(self.python), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300, check=False
        )
        if check:
            assert result.returncode == 0, f"{args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        return result

    def script(self, code: str, env: dict[str, str] | None = None) -> Any:
        """Run ``code`` in this venv; it prints one JSON value as its last line, returned here."""
        out = self.run("-c", textwrap.dedent(code), env=env).stdout
        return json.loads(out.strip().splitlines()[-1])

    def pip(self, *args: str) -> subprocess.CompletedProcess:
        return self.run("-m", "pip", "-q", *args)


def installed_here() -> set[str]:
    """What is installed in the running interpreter's site folders (dist-info, egg-info, .pth)."""
    kinds = (".dist-info", ".egg-info", ".pth", ".egg-link")
    return {os.path.join(d, n) for d in site_dirs() for n in os.listdir(d) if n.endswith(kinds)}


@pytest.fixture
def throwaway_venv(tmp_path_factory) -> Iterator[ThrowawayVenv]:
    """A fresh :class:`ThrowawayVenv`; afterwards, the running interpreter has nothing new installed."""
    before = installed_here()
    yield ThrowawayVenv(tmp_path_factory.mktemp("venv") / "venv")
    after = installed_here()
    assert after == before, (
        f"a test changed what the interpreter running the suite has installed: added {sorted(after - before)}, "
        f"removed {sorted(before - after)}"
    )
