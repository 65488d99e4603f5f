"""How a test starts a child it will send SIGHUP, SIGINT or SIGTERM: with the dispositions set in
the child itself, never inherited from whatever started the suite. Under ``nohup`` the suite's
children inherit an ignored SIGHUP, and as a shell script's background job (``pytest &``) an
ignored SIGINT; a test sending that signal would then wait out its timeout. Pass one of these as
``subprocess.Popen``'s ``preexec_fn``."""

from __future__ import annotations

import signal

STOPS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)


def as_from_a_terminal() -> None:
    """The three stop signals at their defaults, as a shell in a terminal starts a command."""
    for signum in STOPS:
        signal.signal(signum, signal.SIG_DFL)


def as_under_nohup() -> None:
    """As ``nohup`` starts a command: SIGHUP ignored, the other two at their defaults."""
    as_from_a_terminal()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
