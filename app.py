"""PagedLab's entry point: loads the default model once (shared by every session), builds the
Gradio app from ui/ and launches it.

    python app.py [--dry] [--model NAME_OR_PATH] [--host 127.0.0.1] [--port 7860] [--device auto]
                  [--vllm-events tcp://HOST:PORT [--vllm-replay tcp://HOST:PORT]
                   [--vllm-url http://HOST:PORT]]

--model offers one more model beside the built-in ones (an HF id or a local folder of any
architecture the engine supports) and starts on it; a public deployment offers only the
built-in ones unless its operator passes it (or sets PAGEDLAB_MODEL).

--vllm-events opens every page on the vLLM tab, watching the KV events of the vLLM server there
(ui/vllm_panel.py); with --vllm-url (its OpenAI API) the prompt box sends to it, and it is the
lab's vLLM (engine/vllm/lab.py): "Start one here", rooms served by vLLM and lesson 15 use it.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys

if os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true"):
    # A ZeroGPU Space: `spaces` before anything imports torch. It patches torch's CUDA when it is
    # imported and refuses to start where CUDA was initialised first (ui/gpu.py says the rest).
    import spaces  # noqa: F401


def main() -> int:
    ap = argparse.ArgumentParser(description="PagedLab: watch a paged KV cache work, block by block")
    ap.add_argument("--dry", action="store_true", help="start in dry mode (no model)")
    ap.add_argument("--model", default=os.environ.get("PAGEDLAB_MODEL", ""),
                    help="an HF model id or a local folder to offer beside the built-in models")
    ap.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    ap.add_argument("--device", default=os.environ.get("PAGEDLAB_DEVICE", "auto"))
    ap.add_argument("--vllm-events", default="", metavar="tcp://HOST:PORT",
                    help="watch this vLLM's KV events (its --kv-events-config endpoint) at start")
    ap.add_argument("--vllm-replay", default="", metavar="tcp://HOST:PORT",
                    help="its replay endpoint (fills gaps in the events)")
    ap.add_argument("--vllm-url", default="", metavar="http://HOST:PORT",
                    help="its OpenAI API (the vLLM tab's prompts, lesson 15, rooms served by vLLM)")
    args = ap.parse_args()

    # One warm-up per process, not per session: the app builds an engine for each session and
    # replays one on every Back (engine/runtime/runtime.py, _should_warm_up)
    os.environ.setdefault("PAGEDLAB_WARMUP", "once")
    if args.model:
        os.environ["PAGEDLAB_MODEL"] = args.model  # ui/limits.py reads it when ui is imported
    from ui import build_app, limits
    from ui.app import CSS, HEAD, THEME
    from ui.gpu import main_device, place_gpu_model
    from ui.queue_pace import calm_queue

    device = main_device(args.device)  # the CPU on ZeroGPU: its GPU lives in GPU calls only
    mode, note = "dry (bookkeeping only, no model)", ""
    if args.model and not args.dry:
        mode = load_own_model(args.model, device)
    elif not args.dry:
        try:
            from engine.runtime import models  # the process-wide model cache, warmed once

            print("[pagedlab] loading the default model (SmolLM2-135M-Instruct)...", flush=True)
            loaded = models.load_model("default", device, "auto")
            print(f"[pagedlab] the default model came from {loaded.source} ({loaded.device})",
                  flush=True)
            print(f"[pagedlab] ZeroGPU: {place_gpu_model('default')}", flush=True)
            mode = "SmolLM2-135M (real model)"
        except Exception as err:  # the page says why instead of a traceback
            note = (f"\n> **The default model could not be loaded**, so this session starts in dry "
                    f"mode (bookkeeping only). Reason: {err}")
            print(f"[pagedlab] {err}", file=sys.stderr)
    demo = build_app(mode, device, note, vllm_target(args))
    # a few events at once (more only thrash two cores), and a bounded line: past QUEUE_MAX_SIZE
    # waiting events a visitor is told the app is busy instead of waiting without end
    demo.queue(default_concurrency_limit=limits.QUEUE_CONCURRENCY, max_size=limits.QUEUE_MAX_SIZE)
    calm_queue(demo)  # its idle polls every 10 ms, not 1 ms (ui/queue_pace.py)
    # Gradio 6's run history saves every call's inputs and outputs in the browser: each picture's
    # figure, a few hundred KB, written again at every click, until a lesson's pages took a
    # minute each in a long session (the storage service busy). The app keeps its own history.
    quiet = {"run_history": False} if "run_history" in inspect.signature(demo.launch).parameters else {}
    demo.launch(server_name=args.host, server_port=args.port, css=CSS, head=HEAD, theme=THEME, **quiet)
    return 0


def vllm_target(args: argparse.Namespace) -> object:
    """The server --vllm-events names (None: none); with its OpenAI API it is the lab's vLLM."""
    if not args.vllm_events:
        return None
    from engine.vllm.lab import ENV
    from ui.app import VllmTarget

    if args.vllm_url and not os.environ.get(ENV):
        os.environ[ENV] = json.dumps({"url": args.vllm_url, "events": args.vllm_events,
                                      "replay": args.vllm_replay or None})
    print(f"[pagedlab] watching vLLM's KV events at {args.vllm_events}", flush=True)
    return VllmTarget(args.vllm_events, args.vllm_replay or None, args.vllm_url or None)


def load_own_model(name: str, device: str) -> str:
    """Load the --model model once (shared by every session); the app starts on it. A model
    that cannot load stops the app with the reason: the user asked for this one by name."""
    from engine.runtime import models
    from ui.settings_panel import MODES

    print(f"[pagedlab] loading {name}...", flush=True)
    try:
        models.load_model(name, device, "auto")
    except Exception as err:
        raise SystemExit(f"PagedLab cannot load --model {name}: {err}") from err
    return next(label for label, model in MODES.items() if model == name)


if __name__ == "__main__":
    sys.exit(main())
