"""Progress of long phases as logging records, so the library stays quiet and a front end decides what to show.

The pipeline calls `begin(phase, text)` when a phase starts (capture, saturate, extract, validate) and
`step(phase, text, done, total)` within one (each saturation iteration). Both are where a plan built in the
background stops when the process exits (eqsat/support/background.py), and both log at DEBUG to the
"eqsat.support.progress" logger, which has no handler: nothing appears unless someone asks. The CLI installs
`live_progress()`, a rich display driven by these records, when stdout is a terminal; `-vv` prints them as lines.

`depth` nests phases: an event at depth d clears the rows deeper than d (the details of the work d moved on from),
so `benches.run` reports each model at depth 0 and the pipeline's phases appear under it at depth 1.
"""

import contextlib
import logging
import sys
from collections.abc import Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from eqsat.support import background

LOG = logging.getLogger("eqsat.support.progress")


def begin(phase: str, text: str, total: int | None = None, depth: int = 1) -> None:
    """A phase starts; the phase running beside it at this depth, if any, is done."""
    background.checkpoint()
    LOG.debug("%s", text, extra={"eqsat_phase": phase, "eqsat_done": None, "eqsat_total": total, "eqsat_depth": depth})


def step(phase: str, text: str, done: int, total: int | None = None, depth: int = 1) -> None:
    """Progress within a phase: `done` of `total` steps (total None: unknown)."""
    background.checkpoint()
    LOG.debug("%s", text, extra={"eqsat_phase": phase, "eqsat_done": done, "eqsat_total": total, "eqsat_depth": depth})


class ProgressHandler(logging.Handler):
    """Turns the records of begin() and step() into rows of a rich Progress: one row per phase and depth."""

    def __init__(self, progress: Progress) -> None:
        super().__init__(logging.DEBUG)
        self.progress = progress
        self.rows: list[tuple[int, str, TaskID]] = []  # (depth, phase, task), in display order

    def emit(self, record: logging.LogRecord) -> None:
        phase = getattr(record, "eqsat_phase", None)
        if phase is None:
            return
        depth, done, total = record.eqsat_depth, record.eqsat_done, record.eqsat_total
        text = "  " * depth + record.getMessage()
        for row in [r for r in self.rows if r[0] > depth]:
            self.progress.remove_task(row[2])
            self.rows.remove(row)
        task = next((t for d, p, t in self.rows if (d, p) == (depth, phase)), None)
        if done is None:  # begin: the sibling that ran until now is done; this phase (re)starts
            for d, p, t in self.rows:
                if d == depth and p != phase:
                    self._finish(t)
            if task is not None:
                self.progress.reset(task, total=total, description=text)
                return
        if task is None:
            task = self.progress.add_task(text, total=total)
            self.rows.append((depth, phase, task))
        elif done is not None:
            self.progress.update(task, description=text, completed=done, total=total)

    def _finish(self, task: TaskID) -> None:
        done = self.progress.tasks[self._index(task)].completed or 1
        self.progress.update(task, completed=done, total=done)  # a full bar and a tick; the text keeps the count

    def _index(self, task: TaskID) -> int:
        return next(k for k, t in enumerate(self.progress.tasks) if t.id == task)

    def finish_all(self) -> None:
        for _, _, task in self.rows:
            self._finish(task)


@contextlib.contextmanager
def live_progress(enabled: bool | None = None, console: Console | None = None) -> Iterator[Progress | None]:
    """Show eqsat's progress records as a live rich display while the block runs (default: when stdout is a TTY).

    The display is transient: it disappears when the block ends, leaving only what was printed."""
    if enabled is None:
        enabled = sys.stdout.isatty()
    if not enabled:
        yield None
        return
    progress = Progress(
        SpinnerColumn(finished_text="[green]✓"),
        TextColumn("{task.description}"),
        BarColumn(bar_width=24),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    handler = ProgressHandler(progress)
    level = LOG.level
    LOG.addHandler(handler)
    LOG.setLevel(logging.DEBUG)
    try:
        with progress:
            yield progress
            handler.finish_all()
    finally:
        LOG.removeHandler(handler)
        LOG.setLevel(level)


def configure_logging(verbosity: int) -> None:
    """The CLI's -v: INFO records of the "eqsat" logger (plans as they are built) on stderr; -vv adds progress lines.

    Written through a Console on stderr, which rich's live display routes above its rows instead of tearing them."""
    if verbosity <= 0:
        return
    from rich.logging import RichHandler

    handler = RichHandler(console=Console(stderr=True), show_path=False, markup=False)
    handler.setLevel(logging.INFO if verbosity == 1 else logging.DEBUG)
    logger = logging.getLogger("eqsat")
    logger.addHandler(handler)
    logger.setLevel(handler.level)
