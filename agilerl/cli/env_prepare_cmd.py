"""``agilerl env prepare`` and ``agilerl env prepared``: build what a manifest's env needs ahead
of time (in an image build, or on a login node with network before an offline job), list what
is prepared, remove it."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

__all__ = ["add_parsers"]


def add_parsers(sub: Any) -> None:
    """Add ``prepare`` and ``prepared`` to the ``agilerl env`` group."""
    prepare = sub.add_parser(
        "prepare",
        help="Build what manifests' envs need now: an isolated env's venv, or env_packages installed.",
        description="With isolation: venv, the env's uv venv is resolved, built and cached (under "
        "$AGILERL_CACHE_DIR/envs, default ~/.cache/agilerl/envs), so a run starts it with no network; "
        "with isolation: none, its env_packages are installed into this interpreter when missing.",
    )
    prepare.add_argument("manifests", nargs="+", metavar="MANIFEST")
    prepare.add_argument("--offline", action="store_true", help="Use only what uv has cached (no network).")
    prepare.add_argument("--json", action="store_true", help="Print a JSON list instead.")
    prepare.set_defaults(handler=_prepare)
    prepared = sub.add_parser(
        "prepared",
        help="List the prepared env venvs with their sizes, or remove them.",
        description="Each prepared venv is named by the hash of its resolved requirements.",
    )
    prepared.add_argument("--remove", action="append", metavar="HASH", help="Remove this venv; repeatable.")
    prepared.add_argument("--remove-all", action="store_true", help="Remove every prepared venv.")
    prepared.add_argument("--json", action="store_true", help="Print a JSON list instead.")
    prepared.set_defaults(handler=_prepared)


def _prepare(args: argparse.Namespace) -> int:
    from agilerl.envs.entrypoints import entrypoint_factory
    from agilerl.fleet.factory import replica_spec
    from agilerl.fleet.isolation import prepare_env
    from agilerl.manifest.environment import EntrypointSpec
    from agilerl.manifest.spec import load_manifest

    rows: list[dict[str, Any]] = []
    for path in args.manifests:
        manifest = load_manifest(Path(path))
        spec = manifest.environment
        if not isinstance(spec, EntrypointSpec):
            rows.append({"manifest": path, "prepared": None, "note": "nothing to prepare (no entrypoint env)"})
            continue
        started = time.monotonic()
        if spec.isolation == "venv":
            runtime = prepare_env(replica_spec(spec, manifest.base_dir), offline=args.offline)
            rows.append({"manifest": path, "prepared": runtime.venv, "hash": runtime.requirements_hash,
                         "seconds": round(time.monotonic() - started, 2)})
        else:  # resolving the entrypoint installs its env_packages when it is missing
            packages = spec.env_packages.packages if spec.env_packages else None
            entrypoint_factory(spec.entrypoint, base_dir=manifest.base_dir, install=packages)
            rows.append({"manifest": path, "prepared": "the trainer's interpreter",
                         "seconds": round(time.monotonic() - started, 2)})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(f"{row['manifest']}: {row.get('note') or row['prepared']}"
                  + (f" ({row['seconds']} s)" if "seconds" in row else ""))
    return 0


def _prepared(args: argparse.Namespace) -> int:
    from agilerl.fleet.isolation import cache_root, prepared_envs, remove_prepared

    if args.remove or args.remove_all:
        removed = remove_prepared(None if args.remove_all else args.remove)
        print(f"removed {len(removed)} prepared env{'s' if len(removed) != 1 else ''}"
              + (f": {', '.join(removed)}" if removed else ""))
        return 0
    envs = prepared_envs()
    if args.json:
        print(json.dumps([{"hash": e.hash, "path": str(e.path), "size_bytes": e.size_bytes,
                           "requirements": e.requirements, "created": e.created} for e in envs], indent=2))
        return 0
    if not envs:
        print(f"no prepared envs in {cache_root()}")
        return 0
    for e in envs:
        wanted = ", ".join(r for r in e.requirements if not r.startswith("-e ") and not r.startswith("agilerl-envlayer"))
        print(f"{e.hash}  {e.size_bytes / 1e6:7.1f} MB  {time.strftime('%Y-%m-%d %H:%M', time.localtime(e.created))}  "
              f"{wanted or '(agilerl only)'}")
    print(f"in {cache_root()}; remove with: agilerl env prepared --remove HASH (or --remove-all)")
    return 0
