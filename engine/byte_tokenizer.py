"""The dry mode's tokenizer: one token per UTF-8 byte, so dry sessions still show readable text.

There is no model in dry mode, so any tokenizer would be a stand-in; bytes are the honest one:
exact, reversible, and obviously not a real model's vocabulary. Ids of 256 and above (forced by a
caller) print as <id>.
"""

from __future__ import annotations

#: The dry mode accepts any token id below this; only ids < 256 have a byte to show.
DRY_VOCAB_SIZE = 65536

#: What random dry-mode appends draw from: lowercase letters and spaces read like text.
DRY_ALPHABET = tuple(b"abcdefghijklmnopqrstuvwxyz ")


class ByteTokenizer:
    vocab_size = DRY_VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int] | tuple[int, ...]) -> str:
        out, run = [], bytearray()
        for t in token_ids:
            if t < 256:
                run.append(t)
                continue
            out.append(run.decode("utf-8", errors="replace"))
            run.clear()
            out.append(f"<{t}>")
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)

    def token_repr(self, token_id: int) -> str:
        return repr(self.decode([token_id]))
