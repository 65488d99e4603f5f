"""``agilerl manifest validate|schema``."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("manifest", help="Validate a manifest or print its JSON Schema.")
    sub = parser.add_subparsers(dest="manifest_command", metavar="ACTION", required=True)
    validate = sub.add_parser("validate", help="Print the normalised manifest, or every error.")
    validate.add_argument("file")
    validate.set_defaults(handler=_validate)
    schema = sub.add_parser("schema", help="Print the manifest's JSON Schema (for editors).")
    schema.set_defaults(handler=_schema)


def load_manifest_reporting_warnings(path: str) -> Any:
    """``load_manifest``, printing each ignored-key warning as one ``warning:`` line."""
    from agilerl.manifest.spec import load_manifest

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manifest = load_manifest(path)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    return manifest


def _validate(args: argparse.Namespace) -> int:
    import yaml

    manifest = load_manifest_reporting_warnings(args.file)
    data = manifest.model_dump(mode="json", exclude_none=True)
    data["training"]["output_dir"] = manifest.output_dir  # what train will really use
    print(yaml.safe_dump(data, sort_keys=False).rstrip())
    return 0


def _schema(args: argparse.Namespace) -> int:
    from agilerl.manifest.spec import Manifest

    print(json.dumps(Manifest.model_json_schema(by_alias=False), indent=2))
    return 0
