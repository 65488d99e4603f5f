"""``agilerl view``: a run (or an eval results file) as one HTML page, written or served."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from agilerl.cli.args import positive_int

__all__ = ["add_parser"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "view",
        help="See a run: metrics charts, every recorded sample turn by turn (tokens, tool calls, pictures).",
        description="SOURCE is a training run's output_dir (metrics.jsonl, rollouts.jsonl) or an agilerl "
        "eval results file; two or more are shown side by side. Writes one self-contained HTML file that "
        "opens offline from disk, or with --serve shows it on 127.0.0.1, refreshed as the run writes.",
    )
    parser.add_argument("sources", nargs="+", metavar="SOURCE", help="Run folder or eval results .jsonl.")
    parser.add_argument("--out", "-o", help="The HTML file (default: RUN/view.html, or view.html here for several).")
    parser.add_argument("--serve", action="store_true", help="Serve the page on 127.0.0.1 instead, refreshing as rows arrive.")
    parser.add_argument("--port", type=_port, default=8765, help="--serve's port (default: 8765; 0: a free one).")
    parser.add_argument(
        "--max-mb", type=positive_int, default=24,
        help="Records embedded at most, in MB (default: 24); past it each step is sampled, extremes first.",
    )
    parser.set_defaults(handler=_view)


def _view(args: argparse.Namespace) -> int:
    from agilerl.errors import InvalidArgument
    from agilerl.view.page import page_title, write_page
    from agilerl.view.serve import ViewServer
    from agilerl.view.sources import open_source

    sources = [open_source(path) for path in args.sources]
    budget = args.max_mb * 2**20
    if args.serve:
        if args.out:
            raise InvalidArgument("--out writes a file and --serve serves the page: give one of them")
        try:
            server = ViewServer(sources, title=page_title(sources), port=args.port, budget=budget)
        except OSError as exc:
            raise InvalidArgument(f"cannot serve on 127.0.0.1:{args.port} ({exc.strerror}): pick another --port (0: a free one)") from None
        print(f"serving {server.url} (Ctrl-C stops)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
        return 0
    out = Path(args.out) if args.out else _default_out(sources)
    write_page(sources, out, budget=budget)
    shown = sum(len(s.entries) for s in sources)
    print(f"page:    {out} ({out.stat().st_size / 2**20:.1f} MB, {shown} records read)", file=sys.stdout)
    return 0


def _port(text: str) -> int:
    """A TCP port, 0 to 65535 (0: the system picks a free one)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: give 0 to 65535 (0: a free one)")
    return port


def _default_out(sources: list[Any]) -> Path:
    if len(sources) > 1:
        return Path("view.html")
    source = sources[0]
    return source.folder / "view.html" if source.kind == "train" else source.records_path.with_suffix(".html")
