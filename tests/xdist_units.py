"""How the suite's tests are split between xdist workers: each run of one file's tests in the
collection is one unit, kept whole on one worker, in the collection's order.

``tests/conftest.py`` sorts the collection so that tests needing an extra venv come last, in the
order the venvs build; a file with both kinds therefore shows up twice, and each run is a unit of
its own. A unit's module fixtures (a ``vllm serve`` replica, a Ray cluster, the verifiers run) are
built once, on one worker, and a worker never waits for a venv's build between a file's other
tests.

Why not ``--dist loadgroup``: from pytest 9.2 an item's ``nodeid`` no longer reads the
``_nodeid`` that xdist 3.8 rewrites to carry the group, so every test was a unit of its own:
module fixtures were built again on both workers (a vLLM server three times for one file), and
two Ray clusters ran at once. This scheduler needs nothing from the workers but the order of
their collection, which every xdist version sends.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadScopeScheduling


def units(nodeids: list[str]) -> dict[str, str]:
    """Each nodeid's unit: its file, numbered by the file's runs in ``nodeids`` (``a.py#0``, ...)."""
    unit: dict[str, str] = {}
    runs: dict[str, int] = {}
    last = None
    for nodeid in nodeids:
        path = nodeid.split("::", 1)[0]
        if path != last:
            runs[path] = runs.get(path, -1) + 1
            last = path
        unit[nodeid] = f"{path}#{runs[path]}"
    return unit


class FileRunScheduling(LoadScopeScheduling):
    """``LoadScopeScheduling`` whose scopes are ``units``, handed out in collection order."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self._units: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._units is None:  # every worker collected the same list (xdist checks it first)
            self._units = units(next(iter(self.registered_collections.values())))
        return self._units[nodeid]

    def schedule(self) -> None:
        self.config.option.loadscopereorder = False  # the collection's order: extra-venv tests last
        super().schedule()
