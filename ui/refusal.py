"""A refused input: the user sees the message in a box, the server log gets one line.

Gradio prints the full traceback of every `gr.Error` it is handed unless told not to; a refused
input is not a fault of the server, so its log line says what was refused and why, and nothing
more. Unexpected exceptions are not refusals: their handlers print the traceback themselves.
"""

from __future__ import annotations

import sys

import gradio as gr


def refused(where: str, message: str) -> gr.Error:
    """Log `where` (the handler) refused `message` as one line on stderr; return the error to
    raise (the message box), which Gradio will not print again."""
    one_line = " ".join(str(message).split())
    print(f"[pagedlab] refused {where}: {one_line}", file=sys.stderr, flush=True)
    return gr.Error(str(message), print_exception=False)


def failed(message: str) -> gr.Error:
    """The message box for an unexpected exception whose traceback the handler has already
    printed (Gradio would print it a second time)."""
    return gr.Error(message, print_exception=False)
