"""``agilerl manifest validate|schema``."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import Any

__all__ = ["add_parser", "load_manifest_reporting_warnings"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("manifest", help="Validate a manifest or print its JSON Schema.")
    sub = parser.add_subparsers(dest="manifest_command", metavar="ACTION", required=True)
    validate = sub.add_parser(
        "validate",
        help="Print the normalised manifest, or every error train would meet.",
        description="Checks the fields, that every registered name (env, processor, rubric, "
        "algorithm) exists, that referenced files exist and import, and the algorithm's options.",
    )
    validate.add_argument("file")
    validate.add_argument(
        "--offline", action="store_true",
        help="Import no env, rubric or algorithm code: check names and file paths only.",
    )
    validate.set_defaults(handler=_validate)
    schema = sub.add_parser("schema", help="Print the manifest's JSON Schema (for editors).")
    schema.set_defaults(handler=_schema)


def load_manifest_reporting_warnings(path: str) -> Any:
    """``load_manifest``, printing each ignored-key warning as one ``warning:`` line."""
    from agilerl.manifest.spec import load_manifest

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return load_manifest(path)
        finally:  # shown with the errors too: an ignored 'max_turn' may be why 'max_turns' is missing
            for w in caught:
                print(f"warning: {w.message}", file=sys.stderr)


def _validate(args: argparse.Namespace) -> int:
    import yaml

    from agilerl.assembly.checks import manifest_problems
    from agilerl.errors import ManifestError

    manifest = load_manifest_reporting_warnings(args.file)
    problems = manifest_problems(manifest, offline=args.offline)
    if problems:
        raise ManifestError(problems, args.file)
    data = manifest.model_dump(mode="json", exclude_none=True)
    data["training"]["output_dir"] = manifest.output_dir  # what train will really use
    print(yaml.safe_dump(data, sort_keys=False).rstrip())
    return 0


def _schema(args: argparse.Namespace) -> int:
    from agilerl.manifest.spec import Manifest

    print(json.dumps(Manifest.model_json_schema(by_alias=False), indent=2))
    return 0
