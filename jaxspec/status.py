"""One status line on stderr while something slow runs (a compile, the cost timing), so a first run
does not sit silent: after DELAY_S, "compiling EAGLE K=0,2,5 for batch 1 ... 12 s", redrawn each
second on a terminal, then the time it took and whether the result is kept for the next process.
$JAXSPEC_STATUS=0 silences it; not on a terminal only the closing line is written."""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

DELAY_S = 2.0          # quicker work says nothing
STATUS_ENV = "JAXSPEC_STATUS"


def enabled() -> bool:
    return os.environ.get(STATUS_ENV, "1").strip().lower() not in ("0", "off", "false", "no")


@contextlib.contextmanager
def working(what: str, kept: str = ""):
    """Say `what` is going on while the block runs, if it runs longer than DELAY_S; `kept` closes
    the line (e.g. "cached for next time")."""
    if not enabled():
        yield
        return
    stream, start, done = sys.stderr, time.perf_counter(), threading.Event()
    live = getattr(stream, "isatty", lambda: False)()
    shown = []

    def draw():
        if done.wait(DELAY_S):
            return
        shown.append(True)
        while live and not done.is_set():
            stream.write(f"\r{what} ... {time.perf_counter() - start:.0f} s\033[K")
            stream.flush()
            done.wait(1.0)

    painter = threading.Thread(target=draw, daemon=True)
    painter.start()
    try:
        yield
    finally:
        done.set()
        painter.join()
        if shown:
            stream.write(f"{chr(13) if live else ''}{what}: {time.perf_counter() - start:.1f} s"
                         f"{'; ' + kept if kept else ''}\n")
            stream.flush()
