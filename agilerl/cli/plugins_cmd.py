"""``agilerl plugins list|new`` and ``agilerl envs|processors|rubrics|algorithms|models|trackers|backends|tool-parsers list``."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from agilerl.cli.json_output import print_json

__all__ = ["add_parser"]

# command -> the registry kind it lists
_LISTED_KINDS = {
    "envs": "env",
    "processors": "processor",
    "rubrics": "rubric",
    "algorithms": "algorithm",
    "models": "model",
    "trackers": "tracker",
    "backends": "backend",
    "tool-parsers": "tool_parser",
}


def add_parser(subparsers: Any) -> None:
    plugins = subparsers.add_parser("plugins", help="List installed plugins or start a new one.")
    sub = plugins.add_subparsers(dest="plugins_command", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="Installed plugins: what each provides and its status.")
    listing.add_argument("--all", action="store_true", help="Include agilerl's built-ins.")
    listing.add_argument("--json", action="store_true", help="Print JSON instead of a table.")
    listing.set_defaults(handler=_list_plugins)
    new = sub.add_parser("new", help="Create a publishable plugin package agilerl-env-NAME.")
    new.add_argument("name", help="Plugin name, e.g. 'wordle' (creates agilerl-env-wordle).")
    new.add_argument("--dir", default=".", help="Folder to create the package in (default: here).")
    new.set_defaults(handler=_new_plugin)
    for command, kind in _LISTED_KINDS.items():
        parser = subparsers.add_parser(command, help=f"List registered {kind}s.")
        kind_sub = parser.add_subparsers(dest=f"{command}_command", metavar="ACTION", required=True)
        kind_list = kind_sub.add_parser("list", help=f"Registered {kind}s and their plugins.")
        kind_list.add_argument("--json", action="store_true", help="Print JSON instead of a table.")
        kind_list.set_defaults(handler=_list_entries, kind=kind)


def _list_plugins(args: argparse.Namespace) -> int:
    from agilerl.registry import get_registry

    plugins = [p for p in get_registry().plugins if args.all or not p.builtin]
    plugins.sort(key=lambda p: (not p.builtin, p.name))
    if args.json:
        rows = [
            {
                "name": p.name,
                "version": p.version,
                "distribution": p.distribution,
                "module": p.module,
                "builtin": p.builtin,
                "hooks": p.hooks,
                "provides": p.provides,
                "status": p.status,
                "error": p.error,
                "conflicts": p.conflicts,
            }
            for p in plugins
        ]
        print_json(rows)
        return 0
    if not plugins:
        print("No plugins installed (`agilerl plugins list --all` shows the built-ins).")
        return 0
    # Hooks without their common "register_" prefix, so the status (the cause) gets the width.
    table = _Listing("Name", "Version", "Distribution", "Hooks", "Provides", "Status")
    for p in plugins:
        provides = "\n".join(f"{kind}: {_first_names(names)}" for kind, names in p.provides.items())
        status = {"ok": "ok", "error": f"error: {p.error}", "conflict": "conflict: " + "; ".join(p.conflicts)}
        table.add_row(
            p.name,
            p.version or "",
            p.distribution or "",
            "\n".join(hook.removeprefix("register_") for hook in p.hooks),
            provides,
            status[p.status],
        )
    table.print()
    return 0


def _list_entries(args: argparse.Namespace) -> int:
    from agilerl.registry import get_registry

    registry = get_registry()
    entries = registry.entries(args.kind)
    conflicted = {name for kind, name in registry.conflicts() if kind == args.kind}
    if args.json:
        rows = [
            {
                "name": e.name,
                "kind": e.kind,
                "target": e.target_ref,
                "description": e.description,
                "plugin": e.plugin.name,
                "distribution": e.plugin.distribution,
                "version": e.plugin.version,
                "conflict": e.name in conflicted,
            }
            for e in entries
        ]
        print_json(rows)
        return 0
    if not entries:
        print(f"No {args.kind}s registered.")
        return 0
    table = _Listing("Name", "Description", "Plugin", "Status")
    for e in entries:
        source = f"{e.plugin.name} ({e.plugin.distribution})" if e.plugin.distribution else e.plugin.name
        table.add_row(e.name, e.description, source, "conflict" if e.name in conflicted else "ok")
    table.print()
    return 0


def _new_plugin(args: argparse.Namespace) -> int:
    from agilerl.registry.scaffold import scaffold_plugin

    created = scaffold_plugin(args.name, args.dir)
    print(f"Created {created}")
    # python -m: the pip and pytest of the environment that runs agilerl; pytest comes with [test]
    print(f'Next: cd {shlex.quote(str(created))} && python -m pip install -e ".[test]" && python -m pytest')
    return 0


def _first_names(names: list[str], most: int = 3) -> str:
    """A plugin with dozens of names shows a few; ``agilerl envs list`` shows them all."""
    if len(names) <= most:
        return ", ".join(names)
    return f"{', '.join(names[:most])}, ... ({len(names)} in all)"


class _Listing:
    """Rows to print: a rich table on a terminal, plain aligned columns when piped or redirected."""

    def __init__(self, *columns: str) -> None:
        self.columns = columns
        self.rows: list[tuple[str, ...]] = []

    def add_row(self, *cells: str) -> None:
        self.rows.append(cells)

    def print(self) -> None:
        if sys.stdout.isatty():
            self._print_rich()
            return
        # One line per row, nothing folded or cut, so grep and cut see whole values.
        rows = [self.columns, *(tuple(cell.replace("\n", ", ") for cell in row) for row in self.rows)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(self.columns))]
        for row in rows:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())

    def _print_rich(self) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table()
        for column in self.columns:  # names and versions stay on one line, long text folds
            table.add_column(column, overflow="fold", no_wrap=column in ("Name", "Version"))
        for row in self.rows:
            table.add_row(*row)
        Console().print(table)
