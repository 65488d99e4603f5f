"""All the thread and event-loop machinery: worker threads and blocking calls awaited from a loop
(``threads``), event loops and the stop signals (``loops``), and running many env calls at once,
each phase under one timeout (``phases``)."""

from agilerl.concurrency.loops import LOOP_ENV_VAR, LOOP_KINDS, LoopThread, loop_kind, new_event_loop, run, shared_loop, stop_signals
from agilerl.concurrency.phases import run_in_threads, run_on_loop
from agilerl.concurrency.threads import EnvCaller, LoopCalls, SessionThread, WorkerThreads, default_threads

__all__ = [
    "WorkerThreads",
    "SessionThread",
    "LoopCalls",
    "default_threads",
    "EnvCaller",
    "LOOP_ENV_VAR",
    "LOOP_KINDS",
    "loop_kind",
    "new_event_loop",
    "run",
    "LoopThread",
    "shared_loop",
    "run_in_threads",
    "run_on_loop",
    "stop_signals",
]
