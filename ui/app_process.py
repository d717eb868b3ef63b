"""The app as a child process on a free loopback port: for tests and benchmarks that drive it
through HTTP the way a browser or gradio_client does."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import IO

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(argv: list[str], port: int, env: dict[str, str] | None = None, timeout: float = 180,
           log: IO[str] | None = None) -> subprocess.Popen:
    """Start `python *argv --port port` in the repo and wait until the port answers. Its output
    goes to `log` (a file, not a pipe: a chatty server must never block on a full pipe)."""
    log = log if log is not None else tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, *argv, "--port", str(port)], cwd=ROOT,
                            env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
                            text=True)
    proc.log = log  # type: ignore[attr-defined]
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"the app exited at start:\n{output(proc)}") from None
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"the app did not start within {timeout} s:\n{output(proc)}")


def output(proc: subprocess.Popen) -> str:
    """What the app printed so far."""
    log = proc.log  # type: ignore[attr-defined]
    log.flush()
    log.seek(0)
    return log.read()


def stop(proc: subprocess.Popen, timeout: float = 30) -> str:
    """Terminate the app (kill it if it does not go) and return what it printed."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return output(proc)
