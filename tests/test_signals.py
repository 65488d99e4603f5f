"""tests/signals.py: a child a test will signal gets its dispositions from the test, not from
whatever started the suite (``nohup`` ignores SIGHUP; a script's background job ignores SIGINT)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.signals import STOPS, as_from_a_terminal, as_under_nohup

ROOT = Path(__file__).resolve().parent.parent
SHOW = ("import signal; print(*(getattr(h, 'name', None) or h.__name__ for h in "
        "map(signal.getsignal, (signal.SIGHUP, signal.SIGINT, signal.SIGTERM))))")


def _dispositions_of_a_child(preexec_fn) -> str:
    """A child's dispositions, started while this process ignores all three, as ``nohup pytest &`` leaves them."""
    before = {signum: signal.signal(signum, signal.SIG_IGN) for signum in STOPS}
    try:
        return subprocess.run([sys.executable, "-c", SHOW], capture_output=True, text=True, timeout=60,
                              preexec_fn=preexec_fn, check=True).stdout.strip()
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_a_child_started_as_from_a_terminal_has_the_default_dispositions_whatever_the_suite_inherited():
    assert _dispositions_of_a_child(None) == "SIG_IGN SIG_IGN SIG_IGN"  # what the children got before
    assert _dispositions_of_a_child(as_from_a_terminal) == "SIG_DFL default_int_handler SIG_DFL"
    assert _dispositions_of_a_child(as_under_nohup) == "SIG_IGN default_int_handler SIG_DFL"


def test_every_test_that_sends_a_stop_signal_sets_its_childs_disposition():
    # a stop signal named in the call, or a call with a variable beside the name of one
    named = re.compile(r"(send_signal|os\.kill|os\.killpg)\([^)]*SIG(HUP|INT|TERM)")
    some = re.compile(r"(send_signal|os\.kill|os\.killpg)\((?![^)]*SIG[A-Z])")
    stop = re.compile(r"signal\.SIG(HUP|INT|TERM)\b")
    files = [f for folder in ("tests", "plugins") for f in (ROOT / folder).rglob("test_*.py") if ".venv" not in str(f)]
    offenders = [
        f.relative_to(ROOT) for f in files
        if (named.search(text := f.read_text()) or (some.search(text) and stop.search(text))) and "preexec_fn=as_" not in text
    ]
    assert not offenders, f"start the signalled child with preexec_fn=tests.signals.as_from_a_terminal: {offenders}"
