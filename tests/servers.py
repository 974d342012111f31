"""An export's README serve command, started as a user would: on a free loopback port, until healthy."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator


@contextlib.contextmanager
def served(command: str, env: dict | None = None, timeout_s: float = 600) -> Iterator[str]:
    """Run the shell ``command`` plus ``--host 127.0.0.1 --port P`` (a free port); yields the base
    URL once ``/health`` answers, and stops the server's whole group afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    shell = f"{command} --host 127.0.0.1 --port {port}"
    server = subprocess.Popen(
        shell, shell=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            assert server.poll() is None, f"the server exited ({server.returncode}): {shell}"
            try:
                urllib.request.urlopen(f"{base}/health", timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, f"the server did not come up in {timeout_s:g} s"
                time.sleep(0.5)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=60)
