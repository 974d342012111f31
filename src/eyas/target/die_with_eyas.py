"""Become ``argv[1:]``, set to die with eyas; a script, not a module (it imports nothing from eyas).

``python die_with_eyas.py PROGRAM ARGS...`` asks Linux to send SIGTERM when its parent (eyas)
dies, even by SIGKILL, then replaces itself with PROGRAM, which keeps that request across
``exec``. eyas may die before the request is made, and then no signal would come: the parent
pid eyas handed over (``EYAS_PARENT_PID``) tells, since an orphan is adopted by another process.
The variable is removed before the program starts: its own children are not eyas's.
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1

if __name__ == "__main__":
    parent = os.environ.pop("EYAS_PARENT_PID", None)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if parent is not None and os.getppid() != int(parent):
        sys.exit(f"eyas (pid {parent}) exited before {sys.argv[1]} started; nothing to do")
    os.execv(sys.argv[1], sys.argv[1:])
