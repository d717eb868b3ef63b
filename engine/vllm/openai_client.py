"""A small client of a vLLM server's OpenAI API (the standard library's urllib; no SDK): a
completion of token ids (what the conformance tests and lesson 15 send, so both engines see the
same tokens), a chat turn of typed text (what the app's prompt box and a room's students send:
vLLM applies the model's chat template), the prefix-cache reset of a server in dev mode, and
`/health` and `/v1/models`.

Every call says what went wrong in a sentence (`VllmApiError`): a server that does not answer, an
HTTP error with vLLM's own message, an answer that is not vLLM's.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


class VllmApiError(RuntimeError):
    """The server did not do what was asked; the message says why, in a sentence."""


@dataclass(frozen=True)
class ChatAnswer:
    """One chat turn's answer: its text, the prompt's tokens (template included) and how many of
    them vLLM found in its prefix cache (`num_cached_tokens`)."""

    text: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str | None


class OpenAIClient:
    """The OpenAI API of one vLLM server at `url` (http://HOST:PORT). `model`: the name it serves
    under (None: the first of /v1/models, asked on first use)."""

    def __init__(self, url: str, model: str | None = None, timeout_s: float = 300) -> None:
        url = url.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"vLLM's OpenAI API is an http:// address (http://HOST:PORT), got {url!r}")
        self.url, self._model, self.timeout_s = url, model, timeout_s

    # ---- HTTP -----------------------------------------------------------------------------------

    def request(self, path: str, body: dict[str, Any] | None = None, method: str | None = None,
                timeout_s: float | None = None) -> Any:
        """JSON in, JSON out (None for an empty answer); VllmApiError with the reason."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data,
                                     method=method or ("GET" if body is None else "POST"),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as err:
            raise VllmApiError(f"vLLM at {self.url} refused {path} (HTTP {err.code}): "
                               f"{_reason(err)}") from None
        except (urllib.error.URLError, OSError) as err:
            why = getattr(err, "reason", err)
            raise VllmApiError(f"nothing answered at {self.url} ({why}): is vLLM's OpenAI server "
                               f"running there?") from None
        try:
            return json.loads(text) if text.strip() else None
        except json.JSONDecodeError:
            raise VllmApiError(f"{self.url}{path} answered something that is not JSON: "
                               f"{text[:80]!r}; is it vLLM's OpenAI server?") from None

    def healthy(self, timeout_s: float = 2.0) -> bool:
        try:
            self.request("/health", timeout_s=timeout_s)
            return True
        except VllmApiError:
            return False

    @property
    def model(self) -> str:
        """The model name the server serves (asked once)."""
        if self._model is None:
            got = self.request("/v1/models", timeout_s=10)
            names = [m.get("id") for m in (got or {}).get("data", []) if isinstance(m, dict)]
            if not names:
                raise VllmApiError(f"vLLM at {self.url} lists no model at /v1/models")
            self._model = str(names[0])
        return self._model

    # ---- what the lab sends -----------------------------------------------------------------------

    def complete(self, prompt_ids: list[int], max_tokens: int, **sampling: Any) -> dict[str, Any]:
        """One completion of a prompt given as token ids (greedy unless `sampling` says else):
        {"outputs": [token ids of each of the n], "cached_tokens": vLLM's num_cached_tokens,
        "finish": [finish reason of each]}."""
        body = {"model": self.model, "prompt": list(prompt_ids), "max_tokens": max_tokens,
                "temperature": 0.0, "return_token_ids": True, **sampling}
        r = self.request("/v1/completions", body)
        try:
            choices = sorted(r["choices"], key=lambda c: c["index"])
            return {"outputs": [c["token_ids"] for c in choices],
                    "cached_tokens": _cached(r), "finish": [c["finish_reason"] for c in choices]}
        except (KeyError, TypeError) as err:
            raise VllmApiError(f"vLLM's completion answer lacks {err}: {str(r)[:120]}") from None

    def chat(self, text: str, system: str = "", max_tokens: int = 32) -> ChatAnswer:
        """One chat turn (greedy): the user's `text` after an optional system prompt."""
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": text}]
        r = self.request("/v1/chat/completions", {"model": self.model, "messages": messages,
                                                  "max_tokens": max_tokens, "temperature": 0.0})
        try:
            choice, usage = r["choices"][0], r["usage"]
            return ChatAnswer(choice["message"]["content"] or "", int(usage["prompt_tokens"]),
                              _cached(r), int(usage.get("completion_tokens") or 0),
                              choice.get("finish_reason"))
        except (KeyError, IndexError, TypeError) as err:
            raise VllmApiError(f"vLLM's chat answer lacks {err}: {str(r)[:120]}") from None

    def detokenize(self, token_ids: list[int]) -> str:
        """Token ids as text, by the server's own tokenizer (a block's tokens in the picture)."""
        r = self.request("/detokenize", {"model": self.model, "tokens": list(token_ids)},
                         timeout_s=10)
        if not isinstance(r, dict) or not isinstance(r.get("prompt"), str):
            raise VllmApiError(f"vLLM's /detokenize answered {str(r)[:80]}")
        return r["prompt"]

    def reset_prefix_cache(self) -> None:
        """Empty vLLM's prefix cache (it publishes AllBlocksCleared with its next step). Only a
        server in dev mode (VLLM_SERVER_DEV_MODE=1, as the local one runs) offers it."""
        self.request("/reset_prefix_cache", {})


def _cached(r: dict[str, Any]) -> int:
    """vLLM's num_cached_tokens of an answer (0 where the server does not report it: it must be
    started with --enable-prompt-tokens-details)."""
    details = (r.get("usage") or {}).get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def _reason(err: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(err.read().decode() or "{}")
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return str(err.reason)
    msg = body.get("message") or (body.get("error") or {}).get("message") if isinstance(body, dict) else None
    return str(msg or err.reason)[:300]
