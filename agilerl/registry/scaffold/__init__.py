"""``agilerl plugins new NAME``: a publishable plugin package to start from.

The templates under ``template/`` are real files (``.tmpl`` so nothing imports or collects them);
``$name``, ``$module``, ``$distribution``, ``$env_class`` and ``$core_requirement`` are filled in.
"""

from __future__ import annotations

import re
from pathlib import Path
from string import Template

import agilerl
from agilerl.errors import ScaffoldError
from agilerl.registry.plugins import BUILTIN_DISTRIBUTION

__all__ = ["scaffold_plugin", "core_requirement"]

_TEMPLATE_DIR = Path(__file__).parent / "template"
_PLUGIN_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*\Z")
_PREFIX = "agilerl-env-"


def scaffold_plugin(name: str, directory: str | Path = ".") -> Path:
    """Write ``agilerl-env-NAME/`` under ``directory`` and return its path."""
    name = name.removeprefix(_PREFIX)
    if not _PLUGIN_NAME.match(name):
        raise ScaffoldError(
            f"plugin name {name!r} is invalid: use lower-case letters, digits and single '-' "
            "between words, starting with a letter (for example 'wordle' or 'maze-runner')."
        )
    module = "agilerl_env_" + name.replace("-", "_")
    values = {
        "name": name,
        "module": module,
        "distribution": _PREFIX + name,
        "env_class": "".join(part.capitalize() for part in name.split("-")) + "Env",
        "core_requirement": core_requirement(),
    }
    root = Path(directory) / values["distribution"]
    if root.exists():
        raise ScaffoldError(f"{root} already exists; pick another name or --dir.")
    for template in sorted(_TEMPLATE_DIR.rglob("*.tmpl")):
        relative = template.relative_to(_TEMPLATE_DIR).with_suffix("")
        target = root / Path(*(module if part == "module" else part for part in relative.parts))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(Template(template.read_text()).substitute(values))
    return root


def core_requirement() -> str:
    """Our distribution with this release's compatible range, never the unrelated ``agilerl``."""
    major, minor = (int(part) for part in agilerl.__version__.split(".")[:2])
    upper = f"{major}.{minor + 1}" if major == 0 else f"{major + 1}"
    return f"{BUILTIN_DISTRIBUTION}>={major}.{minor},<{upper}"
