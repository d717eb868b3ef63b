"""One browser session's watch of a real vLLM (the vLLM tab): the watch on its KV events
(engine.VllmWatch), its OpenAI API for the prompt box, the prompts sent and their answers, and
what the picture marks since it was last drawn (hashes stored, hashes removed, the tree before).

No widgets and no figures here (ui/vllm_panel.py builds the one and draws the other).
One thread at a time reads the watch (its lock): the page's timer, a Connect click. A prompt is
answered in a thread of its own, so the page never waits for vLLM; the timer shows the answer.
Block texts come from the server's own tokenizer (/detokenize), also in a thread: a block drawn
before its text came shows its token ids, and is drawn again with its text.

    view = VllmView()
    view.connect("tcp://gpu-box:5557", "tcp://gpu-box:5558", "http://gpu-box:8000")
    view.start_here()         # the lab's local vLLM (engine/vllm/lab.py), connected once it answers
    changed = view.poll()     # new events, an answer, a text, a problem: the page redraws
    view.send("What is a page table?")
    view.close()              # the browser session ended
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from engine.describe.prefix_tree import PrefixTree
from engine.vllm import lab
from engine.vllm.openai_client import OpenAIClient, VllmApiError
from engine.vllm.schema import VllmEvent
from engine.vllm.watch import VllmWatch
from ui.limits import UserError
from ui.tab_clock import TabClock

MAX_PROMPT_CHARS = 2000
MAX_SENT = 50  # prompts a session keeps on the page
MAX_RECENT = 12  # events the log beside the picture lists
ANSWER_TOKENS = 48
#: how long a watch waits for a peer (or, connected, for an event) before it says so
SILENCE_S = 8.0


@dataclass
class Sent:
    """A prompt the page sent to vLLM, and its answer once it came."""

    prompt: str
    at: float = field(default_factory=time.monotonic)
    status: str = "sending"  # sending | done | failed
    text: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0


class VllmView:
    def __init__(self) -> None:
        self.watch: VllmWatch | None = None
        self.pending: tuple[VllmWatch, OpenAIClient | None] | None = None  # a new endpoint, not joined yet
        self.client: OpenAIClient | None = None
        self.in_front = False  # the vLLM tab is in front (its timer runs only then)
        self.front_clock = TabClock()  # the page's clock on the event that set in_front
        self.waiting_for_lab = False  # "Start one here" pressed: connect once the lab's answers
        # what the page watched when Gradio ended its session: taken up again at the page's
        # next poll (a page whose heartbeat broke lives on after its unload; see close)
        self.resume: str | tuple[str, str | None, OpenAIClient | None] | None = None
        self._page_tree: PrefixTree | None = None  # on the page then: its replay is not "new"
        self.note = ""  # a sentence for the tab (what was done, or why not)
        self.sent: deque[Sent] = deque(maxlen=MAX_SENT)
        self.recent: deque[VllmEvent] = deque(maxlen=MAX_RECENT)
        self.new: set[int] = set()  # hashes stored since the picture before
        self.removed: set[int] = set()  # hashes removed since the picture before
        self.before: PrefixTree | None = None  # the tree the picture showed before the marks
        self._drawn_tree: PrefixTree | None = None  # the tree the picture shows now
        self.version = 0  # grows with every change the page must draw
        self.drawn = -1  # the version the page drew last
        self.drawn_seq = -1  # vLLM's last message in the picture the page drew last
        self.taken_at: float | None = None  # when the watch took the first message not drawn yet
        self.texts: dict[tuple[int, ...], str] = {}  # a block's tokens -> their text
        self._asked: set[tuple[int, ...]] = set()
        self._to_decode: deque[tuple[int, ...]] = deque()
        self._decoder: threading.Thread | None = None
        self.timeline_drawn = (-1, 0.0)  # (messages, time.monotonic()) of the timeline on the page
        self.shown: dict[str, Any] = {}  # what each panel was last given (a tick sends changes only)
        self.note_sent_at = 0.0  # time.monotonic() when the tab's line was last sent (vllm_panel)
        self._lock = threading.RLock()
        self._problems = 0

    def __deepcopy__(self, memo: dict) -> VllmView:
        return VllmView()  # gr.State copies its first value for every browser session

    def bring(self, in_front: bool, at: float | None) -> bool:
        """A tab event: the vLLM tab came to the front or left it, as the page said at `at` (its
        clock, ms; None: no clock, as from an API call). Gradio handles a page's tab events out
        of order (the select of the tab a page mounted on is unqueued and can land after the
        queued chain that brought this tab in front), so an event older than the one applied
        last is stale: False, and nothing changes."""
        with self._lock:
            if not self.front_clock.admit(at):
                return False
            self.in_front = in_front
            return True

    # ---- connecting ------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return self.watch.endpoint if self.watch is not None else ""

    def connect(self, events: str, replay: str | None = None, url: str | None = None) -> None:
        """Watch the KV events at `events` (replaying gaps from `replay`), and send prompts to the
        OpenAI API at `url` (None: events only). A bad address is refused with what to type; the
        watch the page had stays until the new one exists."""
        events, replay, url = events.strip(), (replay or "").strip() or None, (url or "").strip() or None
        if not events:
            raise UserError("type vLLM's KV events endpoint (tcp://HOST:PORT, its --kv-events-config "
                            "endpoint), or press Start one here")
        try:
            client = OpenAIClient(url) if url else None
            watch = VllmWatch(events, replay, silence_s=SILENCE_S)
        except ValueError as err:
            raise UserError(str(err)) from err
        with self._lock:
            self.waiting_for_lab, self.resume, self._page_tree = False, None, None
            if self.pending is not None:
                self.pending[0].close()
            if self.watch is None or self.watch.mirror.batches == 0:
                self._drop_watch()  # nothing drawn to keep: watch the new one at once
                self.watch, self.client, self.pending = watch, client, None
            else:  # the picture keeps the old watch's cache until the new one answers
                self.pending = (watch, client)
            self.note = f"connecting to {events}…"
            self._changed()

    def connect_lab(self, server: lab.LabServer) -> None:
        self.connect(server.events, server.replay, server.url)
        client = server.client()  # it knows the model's name: no question to /v1/models
        if self.pending is not None:
            self.pending = (self.pending[0], client)
        else:
            self.client = client

    def start_here(self) -> None:
        """The lab's local vLLM (one per app process, shared by every session): started now if it
        is not running; this page connects once it answers."""
        self.resume = None
        running = lab.current()
        if running is not None:
            self.connect_lab(running)
            return
        lab.forget_failure()  # a press after a failure tries again
        lab.start()
        with self._lock:
            self.waiting_for_lab = True
            self.note = "starting a vLLM here (its CPU build, PagedLab's default model): about a minute…"
            self._changed()

    # ---- following ---------------------------------------------------------------------------------

    def poll(self, wait_s: float = 0.0) -> bool:
        """Take what arrived (events, problems, the lab's server answering, texts), waiting up
        to `wait_s` for vLLM's next message while nothing else is new; whether the page must
        redraw."""
        with self._lock:
            if self.resume is not None:
                self._resume()
            if self.waiting_for_lab:
                self._follow_lab()
            if self.pending is not None:
                self._follow_pending()
            if self.watch is not None:
                self._take(self.watch.poll(0 if self.version != self.drawn else wait_s))
                if self.note.startswith("connecting") and self.watch.joined:
                    self.note = ""  # the tab now says "Watching ..."
                    self._changed()
            return self.version != self.drawn

    def _follow_pending(self) -> None:
        """A new endpoint typed while a watch had drawn something: it takes over once vLLM's
        publisher answers it; if it names a problem first, it is dropped and the page keeps the
        watch (and the picture) it had."""
        watch, client = self.pending
        watch.poll(0)
        if watch.joined:
            self._drop_watch()
            self.watch, self.client, self.pending = watch, client, None
            self._changed()
        elif watch.problems:
            watch.close()
            self.pending = None
            self.note = (f"{watch.problems[-1].message} The picture still shows "
                         f"{self.endpoint}, as it was.")
            self._changed()

    def _resume(self) -> None:
        """The page polls after its session was closed (close): watch what it watched again, from
        vLLM's replay buffer on."""
        what, self.resume = self.resume, None
        if what == "lab":
            self.waiting_for_lab = True  # _follow_lab connects once the lab's vLLM answers
            return
        events, replay, client = what
        page_tree = self._page_tree
        try:
            self.connect(events, replay)
        except UserError as err:  # it was a valid address: only a failing ZMQ gets here
            self.note = f"could not watch {events} again: {err}"
            self._changed()
            return
        self.client, self._page_tree = client, page_tree

    def _follow_lab(self) -> None:
        said = lab.status()
        if said == "ready":
            self.connect_lab(lab.current())
        elif said.startswith("failed"):
            self.waiting_for_lab = False
            self.note = f"could not start vLLM here: {said[len('failed: '):]}"
            self._changed()
        elif said.startswith("starting") and said not in self.note:
            self.note = f"{said.replace('starting', 'starting a vLLM here')}: about a minute on 2 cores…"
            self._changed()

    def _take(self, events: list[VllmEvent]) -> None:
        watch = self.watch
        problems = len(watch.problems)
        if problems != self._problems:
            self._problems = problems
            self._changed()
        if not events:
            return
        if self.drawn == self.version:  # the marks say what changed since the picture on screen
            self.before, self.new, self.removed = self._drawn_tree, set(), set()
        if self.taken_at is None:  # when the first message after the tree on screen came
            self.taken_at = time.time()
        for e in events:
            self.recent.appendleft(e)
            if e.kind == "stored":
                self.new.update(e.block_hashes)
            elif e.kind == "removed":
                self.removed.update(e.block_hashes)
                self.new.difference_update(e.block_hashes)
        if self._page_tree is not None:  # the replay after a resume: the page showed these
            self.new -= {n.block_hash for n in self._page_tree.nodes}
            self.before, self._page_tree = self._page_tree, None
        if self.note.startswith("connecting"):
            self.note = ""
        self._changed()

    def drew(self, version: int, tree: PrefixTree) -> None:
        """The page drew `version` (its tree is what the next marks are against)."""
        with self._lock:
            self.drawn, self._drawn_tree, self.taken_at = version, tree, None
            if self.watch is not None:
                self.drawn_seq = self.watch.last_seq

    def _changed(self) -> None:
        self.version += 1

    # ---- block texts -------------------------------------------------------------------------------

    def decode(self, token_ids: list[int]) -> str:
        """A block's text (the server's tokenizer), or its ids until the text came."""
        key = tuple(token_ids)
        text = self.texts.get(key)
        if text is not None:
            return text
        if self.client is not None and key not in self._asked:
            self._asked.add(key)
            self._to_decode.append(key)
            if self._decoder is None or not self._decoder.is_alive():
                self._decoder = threading.Thread(target=self._detokenize, daemon=True,
                                                 name="pagedlab-vllm-texts")
                self._decoder.start()
        return " ".join(map(str, token_ids))

    def _detokenize(self) -> None:
        """Ask the server for the texts asked for, one block at a time, until none is left."""
        while self._to_decode:
            key = self._to_decode.popleft()
            client = self.client
            try:
                text = client.detokenize(list(key)) if client is not None else None
            except VllmApiError:
                continue
            with self._lock:
                if text is not None:
                    self.texts[key] = text
                    self._changed()

    # ---- prompts -----------------------------------------------------------------------------------

    def send(self, text: Any) -> None:
        """Send a prompt to the server's OpenAI API (a chat turn, greedy); the answer comes in a
        thread of its own and shows at the page's next tick."""
        if not isinstance(text, str) or not text.strip():
            raise UserError("type a prompt for vLLM first")
        if len(text) > MAX_PROMPT_CHARS:
            raise UserError(f"the prompt has {len(text)} characters; the most sent is {MAX_PROMPT_CHARS}")
        if self.client is None:
            raise UserError("no OpenAI API to send to: connect with the server's http://HOST:PORT "
                            "address, or press Start one here")
        with self._lock:
            if sum(s.status == "sending" for s in self.sent) >= 4:
                raise UserError("four prompts are on their way already: wait for an answer")
            record = Sent(text.strip())
            self.sent.appendleft(record)
            self._changed()
        threading.Thread(target=self._answer, args=(self.client, record), daemon=True).start()

    def _answer(self, client: OpenAIClient, record: Sent) -> None:
        try:
            got = client.chat(record.prompt, max_tokens=ANSWER_TOKENS)
            update = {"status": "done", "text": got.text, "prompt_tokens": got.prompt_tokens,
                      "cached_tokens": got.cached_tokens}
        except VllmApiError as err:
            update = {"status": "failed", "text": str(err)}
        with self._lock:
            for k, v in update.items():
                setattr(record, k, v)
            self._changed()

    # ---- the end -----------------------------------------------------------------------------------

    def _watched(self) -> str | tuple[str, str | None, OpenAIClient | None] | None:
        """What this page watches (or is about to): "lab" while the lab's vLLM starts, else the
        newest watch's endpoints and its OpenAI client; None: nothing."""
        if self.waiting_for_lab:
            return "lab"
        watch, client = self.pending if self.pending is not None else (self.watch, self.client)
        return None if watch is None else (watch.endpoint, watch.replay_endpoint, client)

    def _drop_watch(self) -> None:
        if self.watch is not None:
            self.watch.close()
        self.watch, self._problems, self.drawn_seq = None, 0, -1
        self.recent.clear()
        self.new, self.removed, self.before, self._drawn_tree = set(), set(), None, None

    def close(self) -> None:
        """The browser session ended: end the subscription (the lab's server stays: it is the
        app's). Gradio ends a session when its page's heartbeat connection breaks, and a page
        whose heartbeat broke (a loaded machine, a network blip) lives on and keeps polling:
        what it watched is kept, and its next poll watches it again."""
        with self._lock:
            self.resume, self._page_tree = self._watched(), self._drawn_tree
            self._drop_watch()
            if self.pending is not None:
                self.pending[0].close()
                self.pending = None
            self.waiting_for_lab = False
