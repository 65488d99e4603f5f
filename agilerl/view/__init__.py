"""The run viewer: one self-contained HTML page of a run's metrics and recorded samples, or of an
eval results file (``agilerl view``). It reads files only, never training code, so the plain
install can view (docs/viewer.md)."""

from agilerl.view.page import page_data, render_page, write_page
from agilerl.view.serve import ViewServer
from agilerl.view.sources import Source, open_source

__all__ = ["Source", "open_source", "page_data", "render_page", "write_page", "ViewServer"]
