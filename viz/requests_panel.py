"""The serving requests panel: every request from the moment it is added (waiting, running,
preempted, swapped, finished), its prompt, and per sample or beam the text it produced so far
(finished: the final text, its cumulative log prob or beam score, why it stopped).

A pure function of what the engine's public face says: the requests still in the scheduler
(`eng.requests()`), the finished ones' outputs (`eng.finished_requests()`), the snapshot (the
text of live sequences) and the add_request operations of the op log (prompt and parameters).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence

from engine.core.outputs import RequestOutput
from engine.core.request_state import RequestState
from engine.describe.snapshot import Snapshot
from engine.ops import AddRequest

MAX_PROMPT_CHARS_SHOWN = 160
MAX_OUTPUT_CHARS_SHOWN = 600
STATUS_COLOUR = {"waiting": "#8a6d00", "preempted": "#b3261e", "running": "#1f6f3f",
                 "swapped": "#b3261e", "finished": "#555"}

Decode = Callable[[Sequence[int]], str]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _prompt(added: AddRequest | None, fallback: Sequence[int], decode: Decode) -> str:
    if added is not None and isinstance(added.prompt, str):
        return added.prompt
    ids = added.prompt if added is not None else fallback
    return decode(list(ids)) if ids else ""


def _kind(added: AddRequest | None, num_outputs: int) -> tuple[str, str]:
    """(what one output is called, what its number is called)."""
    if added is not None and added.params.beam_width > 1:
        return "beam", "beam score"
    return ("sample" if num_outputs > 1 or (added and added.params.n > 1) else "output"), "log prob"


def _row(label: str, text: str, note: str, score: str | None = None) -> str:
    data = f" data-score='{html.escape(score)}'" if score is not None else ""
    return (f"<li class='request-output'{data}><b>{html.escape(label)}</b> "
            f"<span class='output-text' style='font-family:monospace;white-space:pre-wrap;"
            f"background:rgba(76,120,168,0.12);border-radius:3px'>"
            f"{html.escape(_cut(text, MAX_OUTPUT_CHARS_SHOWN)) or '<i>(nothing yet)</i>'}</span>"
            f" <small>{html.escape(note)}</small></li>")


def _header(rid: int, status: str, added: AddRequest | None, prompt: str, extra: str) -> str:
    params = ""
    if added is not None:
        p = added.params
        what = f"beam width {p.beam_width}" if p.beam_width > 1 else f"n = {p.n}"
        params = f" · {what} · max tokens {p.max_tokens} · temperature {p.temperature:g}"
    colour = STATUS_COLOUR.get(status, "#555")
    return (f"<div><b>request {rid}</b> <span class='request-status' style='color:{colour};"
            f"font-weight:600'>{html.escape(status)}</span>{html.escape(extra)}"
            f"<small>{html.escape(params)}</small></div>"
            f"<div><small>prompt:</small> <span class='request-prompt' style='font-family:"
            f"monospace'>{html.escape(_cut(prompt, MAX_PROMPT_CHARS_SHOWN))}</span></div>")


def _live(req: RequestState, added: AddRequest | None, snap: Snapshot, decode: Decode) -> str:
    status = req.status
    if status == "waiting" and req.num_preemptions:
        status = "preempted"  # back in the queue, to be recomputed
    extra = f" (preempted {req.num_preemptions}×)" if req.num_preemptions else ""
    prompt = _prompt(added, (), decode)
    rows = []
    label, _ = _kind(added, len(req.live_seq_ids))
    for i, sid in enumerate(req.live_seq_ids):
        seq = snap.sequences.get(sid)
        text, note = "", "waiting for a step to schedule it"
        if seq is not None and seq.num_tokens:
            ids = list(seq.token_ids[seq.prompt_len:])
            if seq.pending_token is not None:
                ids.append(seq.pending_token)
            text = decode(ids) if ids else ""
            note = f"seq {sid}, {seq.status}, {len(ids)} tokens so far"
        elif status == "swapped":
            note = f"seq {sid}, its blocks in CPU memory"
        rows.append(_row(f"{label} {i + 1}" if len(req.live_seq_ids) > 1 else label, text, note))
    return _request(req.request_id, status, _header(req.request_id, status, added, prompt, extra),
                    rows)


def _finished(out: RequestOutput, added: AddRequest | None, decode: Decode) -> str:
    label, score_name = _kind(added, len(out.outputs))
    extra = f" (preempted {out.num_preemptions}×)" if out.num_preemptions else ""
    if out.draft_tokens:
        extra += f" (drafts: {out.accepted_tokens} of {out.draft_tokens} kept)"
    prompt = _prompt(added, out.prompt_token_ids, decode)
    rows = []
    for c in out.outputs:
        name = f"{label} {c.index + 1}" if len(out.outputs) > 1 else label
        score = f"{c.cumulative_logprob:.3f}"
        why = {"length": "hit max tokens", "eos": "end of sequence", "stop": "stop string",
               None: "stopped"}.get(c.finish_reason, str(c.finish_reason))
        rows.append(_row(name, c.text, f"{score_name} {score} · {len(c.token_ids)} tokens · {why}",
                         score))
    return _request(out.request_id, "finished",
                    _header(out.request_id, "finished", added, prompt, extra), rows)


def _request(rid: int, status: str, header: str, rows: list[str]) -> str:
    return (f"<div class='request' data-request='{rid}' data-status='{status}' "
            f"style='margin:6px 0;padding:4px 6px;border-left:3px solid "
            f"{STATUS_COLOUR.get(status, '#555')}'>{header}"
            f"<ol style='margin:2px 0 0 0;padding-left:1.2em;list-style:none'>{''.join(rows)}</ol>"
            f"</div>")


def requests_html(requests: Sequence[RequestState], finished: Sequence[RequestOutput],
                  snap: Snapshot, decode: Decode,
                  added: Mapping[int, AddRequest] | None = None) -> str:
    """Every request, by id: the unfinished ones from the scheduler's queues, the finished ones
    with each sample's or beam's text and score. '' when no request was ever added."""
    added = added or {}
    parts: dict[int, str] = {}
    for out in finished:
        parts[out.request_id] = _finished(out, added.get(out.request_id), decode)
    for req in requests:
        parts[req.request_id] = _live(req, added.get(req.request_id), snap, decode)
    if not parts:
        return ""
    counts: dict[str, int] = {}
    for req in requests:
        counts[req.status] = counts.get(req.status, 0) + 1
    if finished:
        counts["finished"] = len(finished)
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    return (f"<div id='requests-panel'><b>Requests</b> <small>({html.escape(summary)})</small>"
            f"{''.join(parts[rid] for rid in sorted(parts))}</div>")


def added_requests(trace: Sequence[Mapping]) -> dict[int, AddRequest]:
    """The add_request operations of an op log by the request id each got (ids count up from 0
    in the order the requests were added)."""
    ops = [AddRequest.from_record(dict(rec)) for rec in trace if rec.get("op") == AddRequest.name]
    return dict(enumerate(ops))
