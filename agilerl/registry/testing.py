"""Real plugin distributions in a temp folder, in milliseconds, for tests and benchmarks.

``write_distribution`` lays out what ``pip install`` would leave behind (modules plus a
``.dist-info`` folder), so entry-point discovery runs for real once the folder is on
``sys.path``; ``build_wheel`` packs the same into a wheel that pip and uv install;
``overlay_venv`` makes a venv to install them into without touching the running interpreter.
"""

from __future__ import annotations

import base64
import hashlib
import site
import subprocess
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from agilerl.registry.plugins import ENTRY_POINT_GROUP

__all__ = ["write_distribution", "build_wheel", "site_dirs", "overlay_venv"]


def write_distribution(
    site_dir: str | Path,
    name: str,
    version: str = "1.0",
    files: Mapping[str, str] | None = None,
    *,
    plugins: Mapping[str, str] | None = None,
    requires: Sequence[str] = (),
) -> Path:
    """Install ``name`` into ``site_dir``: ``files`` (path -> text) and its dist-info folder.

    ``plugins`` maps entry-point names to modules in the ``agilerl.plugins`` group.
    """
    site = Path(site_dir)
    contents = _distribution_files(name, version, files or {}, plugins or {}, requires)
    for relative, text in contents.items():
        path = site / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return site / _dist_info(name, version)


def build_wheel(
    dest_dir: str | Path,
    name: str,
    version: str = "1.0",
    files: Mapping[str, str] | None = None,
    *,
    plugins: Mapping[str, str] | None = None,
    requires: Sequence[str] = (),
) -> Path:
    """A pure-Python wheel of the same layout as :func:`write_distribution`, with a valid RECORD."""
    contents = _distribution_files(name, version, files or {}, plugins or {}, requires)
    dist_info = _dist_info(name, version)
    wheel = Path(dest_dir) / f"{_project(name)}-{version}-py3-none-any.whl"
    wheel.parent.mkdir(parents=True, exist_ok=True)
    contents[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: agilerl.registry.testing\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n"
    )
    record = []
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in contents.items():
            data = text.encode()
            archive.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={digest},{len(data)}")
        record.append(f"{dist_info}/RECORD,,")
        archive.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return wheel


def _distribution_files(
    name: str,
    version: str,
    files: Mapping[str, str],
    plugins: Mapping[str, str],
    requires: Sequence[str],
) -> dict[str, str]:
    dist_info = _dist_info(name, version)
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {req}\n" for req in requires)
    contents = dict(files)
    contents[f"{dist_info}/METADATA"] = metadata
    if plugins:
        lines = [f"[{ENTRY_POINT_GROUP}]", *(f"{ep} = {module}" for ep, module in plugins.items())]
        contents[f"{dist_info}/entry_points.txt"] = "\n".join(lines) + "\n"
    return contents


def _project(name: str) -> str:
    return name.replace("-", "_").replace(".", "_")


def _dist_info(name: str, version: str) -> str:
    return f"{_project(name)}-{version}.dist-info"


def site_dirs() -> list[str]:
    """The running interpreter's site folders: its own, the user's when enabled, and any other
    ``site-packages``/``dist-packages`` folder on ``sys.path``."""
    found = [*site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        found.append(site.getusersitepackages())
    found += [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    return [p for p in dict.fromkeys(found) if Path(p).is_dir()]


def overlay_venv(root: str | Path) -> tuple[Path, Path]:
    """A new venv at ``root`` that sees this interpreter's packages; ``(python, its site-packages)``.

    ``venv --system-site-packages`` would see only the base interpreter's packages, not those of
    a venv this runs in; a ``.pth`` file calling ``site.addsitedir`` on each of this interpreter's
    site folders works from both (their ``.pth`` files, editable installs included, run too), so
    nothing is reinstalled and what is installed into the new venv stays there.
    """
    root = Path(root)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )
    overlay = "".join(f"import site; site.addsitedir({folder!r})\n" for folder in site_dirs())
    (purelib / "_agilerl_parent_env.pth").write_text(overlay)
    return python, purelib
