"""The dry mode's tokenizer: one token per UTF-8 byte, so dry sessions still show readable text.

There is no model in dry mode, so any tokenizer would be a stand-in; bytes are the honest one:
exact, reversible, and obviously not a real model's vocabulary. The dry vocabulary is the 256
byte values.
"""

from __future__ import annotations

DRY_VOCAB_SIZE = 256

#: What random dry-mode appends draw from: lowercase letters and spaces read like text.
DRY_ALPHABET = tuple(b"abcdefghijklmnopqrstuvwxyz ")


class ByteTokenizer:
    vocab_size = DRY_VOCAB_SIZE

    def __init__(self) -> None:
        # narration shows a token per append: precompute the 256 tokens' reprs
        self._reprs = tuple(repr(bytes([b]).decode("utf-8", errors="replace")) for b in range(256))

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int] | tuple[int, ...]) -> str:
        return bytes(token_ids).decode("utf-8", errors="replace")

    def token_repr(self, token_id: int) -> str:
        return self._reprs[token_id]
