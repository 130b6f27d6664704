"""Plans built beside the program, as a tiered JIT builds its optimized tier: a signature's first call runs
jax.jit's program while its plan is built here, and a later call switches to the plan once it is ready
(eqsat/dispatch/dispatcher.py, optimize(background=True)).

One daemon thread builds the plans, one at a time. When the process exits, the plan being built stops at its next
progress event (eqsat/support/progress.py: each phase, saturation iteration and kernel measured) and the queued ones are
dropped, so an exit waits a second or so, never for a whole plan.
"""

import concurrent.futures.thread  # noqa: F401 (its exit hook registered before _stop, which therefore runs first)
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class Stopped(BaseException):  # not an Exception: planning's own fallbacks (`except Exception`) let it through
    """The process is exiting: the plan being built is dropped."""


# optimize()'s default; the tests switch it off (tests/conftest.py), so that which program a call runs does not
# depend on how fast the machine plans; tests/test_background.py switches it on itself
ON_BY_DEFAULT = os.environ.get("EQSAT_BACKGROUND", "1") != "0"

_jobs: "queue.SimpleQueue[tuple[Future, Callable[[], Any]] | None]" = queue.SimpleQueue()
_stopping = threading.Event()
_may_run = threading.Event()  # cleared while a call compiles and runs the original its trace chose (pause())
_may_run.set()
_pauses = 0
_worker: threading.Thread | None = None
_worker_lock = threading.Lock()
_EXIT_WAIT_SECONDS = 30.0  # a bound, not the usual: the plan being built stops at its next progress event


def submit(build: Callable[[], Any]) -> Future:
    """build() on the planning thread; its result (or its error) in the future."""
    global _worker
    future: Future = Future()
    with _worker_lock:
        if _worker is None:
            _worker = threading.Thread(target=_work, name="eqsat-planner", daemon=True)
            _worker.start()
    _jobs.put((future, build))
    return future


def checkpoint() -> None:
    """Where planning may stop: on the planning thread, waits while paused, and raises Stopped once the process
    is exiting."""
    if threading.current_thread() is not _worker:
        return
    while not _may_run.wait(0.1):
        if _stopping.is_set():
            break
    if _stopping.is_set():
        raise Stopped


def exiting() -> bool:
    """On the planning thread, once the process exits: a failure now is the interpreter's shutdown (no new threads,
    no new futures), not the plan's, and is not worth a warning."""
    return threading.current_thread() is _worker and _stopping.is_set()


def pause() -> None:
    """Planning waits at its next checkpoint until resume(): a first call that left its plan to the background
    compiles and runs the original without planning beside it (on two cores, that made it twice jax.jit's)."""
    global _pauses
    with _worker_lock:
        _pauses += 1
        _may_run.clear()


def resume() -> None:
    global _pauses
    with _worker_lock:
        _pauses -= 1
        if _pauses == 0:
            _may_run.set()


def _work() -> None:
    while (job := _jobs.get()) is not None:
        future, build = job
        if _stopping.is_set() or not future.set_running_or_notify_cancel():
            continue
        try:
            checkpoint()  # a job submitted paused starts once it is resumed
            future.set_result(build())
        except BaseException as error:  # the caller's to see, Stopped included
            future.set_exception(error)
        del job, future, build  # what the job holds (the optimized function) is not kept until the next one


def _stop() -> None:
    """Before the interpreter shuts down: the plan being built stops, the thread ends. It runs among threading's
    exit hooks, which run in reverse order and before atexit's: before jax's backends go and before
    concurrent.futures refuses new work (a plan then compiling its reference failed with "cannot schedule new
    futures after interpreter shutdown" and warned)."""
    _stopping.set()
    _may_run.set()
    _jobs.put(None)
    if _worker is not None:
        _worker.join(_EXIT_WAIT_SECONDS)


threading._register_atexit(_stop)  # threading's own exit hooks, as concurrent.futures registers its own
