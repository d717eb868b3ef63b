"""The lab's vLLM: the one vLLM server this process works beside, shared by everything in it (the
app's browser sessions, its rooms and lessons; a test session).

It is either started here (`start()`: the local CPU vLLM of engine/vllm/server.py on PagedLab's
default model, once per process, in a thread of its own so no caller waits for its minute-long
start unless it asks to, stopped at exit) or adopted: `PAGEDLAB_VLLM_SERVER` names a running one
as JSON {"url": "http://HOST:PORT", "events": "tcp://HOST:PORT" or "ipc://...", "replay":
"tcp://HOST:PORT" or null, "model": name or null} (how a test session hands its server to the app
processes it starts, and how app.py's --vllm-url points the app at a GPU box's vLLM).

    lab.start()            # begin starting the local server (no wait); idempotent
    lab.status()           # "none" | "starting (23 s)" | "ready" | "failed: <why>"
    server = lab.current() # a LabServer once one answers, else None
    server = lab.wait(600) # start if allowed and wait: a LabServer, or LabUnavailable
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from dataclasses import dataclass

from engine.vllm.openai_client import OpenAIClient
from engine.vllm.server import ServerConfig, VllmServer, VllmUnavailable

ENV = "PAGEDLAB_VLLM_SERVER"
#: "0": nothing here starts a local vLLM by itself (a lesson waits for one started otherwise);
#: the test suite sets it, so that only its one session-wide server ever starts
AUTOSTART_ENV = "PAGEDLAB_VLLM_AUTOSTART"


class LabUnavailable(RuntimeError):
    """No vLLM beside the lab now; the message says why and how to get one."""


@dataclass(frozen=True)
class LabServer:
    """How to reach the lab's vLLM: its OpenAI API, its KV events (a watch connects), its replay
    endpoint; `local`: started here (its prefix cache can be reset: dev mode)."""

    url: str
    events: str
    replay: str | None
    model: str | None = None
    local: bool = False

    def client(self) -> OpenAIClient:
        return OpenAIClient(self.url, self.model)


_lock = threading.Lock()
_config = ServerConfig()  # the local server's settings: PagedLab's defaults
_server: VllmServer | None = None
_started_at: float | None = None
_ready: LabServer | None = None
_failed = ""


def adopted() -> LabServer | None:
    """The server PAGEDLAB_VLLM_SERVER names (None when unset); a ValueError for one that is not
    the JSON it must be."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        d = json.loads(raw)
        return LabServer(str(d["url"]), str(d["events"]), d.get("replay"), d.get("model"),
                         bool(d.get("local", False)))
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{ENV} must be JSON {{\"url\": ..., \"events\": ..., \"replay\": ...}}: "
                         f"{err}") from None


def current() -> LabServer | None:
    """The lab's vLLM when one answers now: adopted, or started here and ready."""
    return adopted() or _ready


def status() -> str:
    """Where the lab's vLLM stands, in a few words."""
    if current() is not None:
        return "ready"
    with _lock:
        if _failed:
            return f"failed: {_failed}"
        if _started_at is not None:
            return f"starting ({time.monotonic() - _started_at:.0f} s)"
    return "none"


def start() -> None:
    """Start the local vLLM (once per process) and return at once: its process is up, its
    answer a minute or so away (a thread waits for it). An adopted server, or one started
    already, makes it a no-op; so does one that failed (its reason stays in `status()`), until
    `forget_failure()`."""
    global _server, _started_at, _failed
    with _lock:
        if adopted() is not None or _started_at is not None or _failed:
            return
        _started_at = time.monotonic()
        try:
            _server = VllmServer(_config)
        except (VllmUnavailable, OSError, ValueError) as err:
            _failed = str(err)
            return
        server = _server
    threading.Thread(target=_wait_ready, args=(server,), name="pagedlab-vllm-start",
                     daemon=True).start()


def _wait_ready(server: VllmServer) -> None:
    global _ready, _failed
    try:
        server.wait_ready(timeout_s=900)
    except RuntimeError as err:
        with _lock:
            _failed = f"the local vLLM did not start: {err}"
        return
    with _lock:
        if _server is server:  # not stopped meanwhile
            _ready = LabServer(server.url, server.events_endpoint, server.replay_endpoint,
                               server.config.model, local=True)


def forget_failure() -> None:
    """Let `start()` try again after a failure."""
    global _failed, _started_at
    with _lock:
        _failed, _started_at = "", None


def autostart_allowed() -> bool:
    return os.environ.get(AUTOSTART_ENV, "1").strip() != "0"


def wait(timeout_s: float = 900.0, start_one: bool = True) -> LabServer:
    """The lab's vLLM, once it answers: the one there is, or (`start_one` and autostart allowed)
    the local one started now. LabUnavailable with the reason otherwise."""
    got = current()
    if got is not None:
        return got
    if start_one and autostart_allowed():
        start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got, said = current(), status()
        if got is not None:
            return got
        if said.startswith("failed") or said == "none":
            break
        time.sleep(0.2)
    said = status()
    if said == "none":
        raise LabUnavailable("no vLLM runs beside PagedLab here: start one in the app's vLLM tab "
                             "(Start one here), or run `python app.py --vllm-events tcp://HOST:PORT`")
    raise LabUnavailable(said[len("failed: "):] if said.startswith("failed") else
                         f"the local vLLM is still starting ({said})")


def stop() -> None:
    """Stop the local server (if this process started one); an adopted one is not ours."""
    global _server, _ready, _started_at
    with _lock:
        server, _server, _ready, _started_at = _server, None, None, None
    if server is not None:
        server.close()


atexit.register(stop)
