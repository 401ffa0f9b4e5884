"""The status line of slow work (jaxspec/status.py)."""
from __future__ import annotations

import time

from jaxspec import status


def test_slow_work_says_what_it_did_and_quick_work_says_nothing(monkeypatch, capsys):
    monkeypatch.setattr(status, "DELAY_S", 0.05)
    with status.working("compiling EAGLE K=0,2,5 for batch 1", "cached for next time"):
        time.sleep(0.3)
    line = capsys.readouterr().err
    assert line.startswith("compiling EAGLE K=0,2,5 for batch 1: 0.") and line.endswith("s; cached for next time\n")
    with status.working("quick"):
        pass
    monkeypatch.setenv(status.STATUS_ENV, "0")
    with status.working("silenced"):
        time.sleep(0.2)
    assert capsys.readouterr().err == ""
