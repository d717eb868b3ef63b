"""The page's look: one theme for teaching (type, spacing, the picture first), presenter mode
(large type everywhere) and the script that makes the picture clickable and moving
(ui/motion.js), with the one that draws each figure once (ui/draws.js). app.py passes CSS, HEAD
and THEME to Gradio's launch()."""

from __future__ import annotations

import os

import gradio as gr

HERE = os.path.dirname(os.path.abspath(__file__))


def _script(name: str) -> str:
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return f"<script>\n{f.read()}\n</script>"


# draws.js: one Plotly draw per figure sent, the picture painted first (Gradio's Plot draws each
# update twice); motion.js: the picture's clicks and motion; nudge.js: an answer Gradio's client
# lost fetched (ui/stream_nudge.py)
HEAD = _script("draws.js") + "\n" + _script("motion.js") + "\n" + _script("nudge.js")

THEME = gr.themes.Soft(primary_hue="blue", neutral_hue="slate", text_size="md",
                       font=[gr.themes.Font(name) for name in ("Source Sans 3", "system-ui", "sans-serif")])

CSS = """
.pl-hidden { display: none !important }
.nav-holder { display: none !important }  /* Gradio draws a page menu once the room pages exist */
#top-bar { align-items: center; gap: 8px; }
#top-bar p { margin: 0 }
#pool-plot { min-height: 360px }
#pool-plot .nsewdrag { cursor: pointer !important }
/* busy: while an operation runs (the status line's tracker shows "processing | 0.8s"), the
   picture dims after 0.3 s, so a slow step reads as under way, never as frozen; Back / Next
   (recorded views) end before it shows. A refused action leaves the tracker showing "Error"
   (with an .error child): nothing runs then, and the picture is as it was */
#pool-plot { transition: opacity .15s }
body:has(#status [data-testid=status-tracker]:not(.hide):not(:has(.error))) #pool-plot {
  opacity: .55; transition: opacity .2s .3s }
/* zoom tools: the picture is fixed (the inspector's too: on a phone they covered its title) */
#pool-plot .modebar-container, #room-plot .modebar-container, #kv-plot .modebar-container {
  display: none !important }
#status p { margin: 0; color: #5f6b7a }
#event-log { max-height: 320px; overflow-y: auto }
#controls-col .tab-container button, #controls-col button { white-space: nowrap }
#controls-col .tab-container button { min-width: 0 !important }
body:not(.pl-presenter) #controls-col .tab-container button { padding: 4px 9px !important }
/* six tabs need ~450 px; the column has 330-410 beside the picture (~340 in presenter mode on a
   1024 x 768 projector): a second row, never a name cut short ("Playgrour", "Compar" at 1280 x
   720). Where they fit, wrapping changes nothing; a lesson slide hides them. The rule names the
   body, so Gradio's scoped copy of it matches nothing and cannot outrank the slide's; for the
   same reason it is not in a @media block, where Gradio keeps only the scoped copy */
body:not(.pl-presenter.pl-lesson) #controls-col .tab-container[role=tablist] {
  flex-wrap: wrap !important; height: auto !important; row-gap: 2px }
/* ... and the second row grows down: Gradio's wrapper is one row high and centres its content,
   so a second row grew up under the top bar, which took the first row's clicks */
#controls-col .tab-wrapper { height: auto !important; align-items: flex-start !important }
/* a row of buttons shares its width by their labels ("Step" needs less than "Run to the end"),
   and a label that still does not fit takes a second line rather than being cut */
#controls-col .row > button:not([role=tab]) { flex: 1 1 auto !important; white-space: normal !important }
/* ... but the lesson's picker takes what Start leaves: a lesson's title is longer than "Start" */
#controls-col #lesson-choose > button { flex: 0 0 auto !important }
/* the workload's picker takes its row, Load under it: a workload's name is wider than the
   column leaves it beside a button (it read "a shared prefix (a c" in presenter mode at
   1024 x 768, and was cut on a phone) */
#controls-col #workload-row > .form { min-width: 100% !important }
/* Presenter mode, for a projector at 1280 x 720 and up: the page is a SLIDE. The picture takes
   the left ~63% of the screen at its full height (it is drawn to fit the box the page measured:
   ui/picture_box.py), the column beside it the rest; nothing scrolls. --slide is the body text:
   20 px at 1280 x 720, growing with the screen (30 px at 1920 x 1080). With a lesson in front
   (pl-lesson, set by ui/motion.js) the column holds only the page: where it is, its title, the
   key sentence (24 px and up), the rest of the text, the question, Back / Next. */
body.pl-presenter { --slide: max(20px, min(1.5625vw, 2.78vh)); }
/* The vLLM tab in front (pl-vllm, set by ui/motion.js): the page shows vLLM's cache, and the
   session's own panels (the view under its picture and its choice, its events, the inspector,
   its sequences and counts) would describe an engine that is not on the screen */
body.pl-vllm :is(#view-plot, #view-choice, #event-log, #inspector, #below) { display: none !important }
/* ... and vLLM's picture takes the session's picture's place: swapped here, in the page, so
   that the last tab clicked wins however the server's answers come back */
body.pl-vllm #pool-plot, body:not(.pl-vllm) #vllm-picture { display: none !important }
/* the session's tools (its timeline) act on the session only: not beside a lesson or vLLM.
   Hidden here too, not by the server, for the same reason */
body:is(.pl-lesson, .pl-vllm) #playground-tools { display: none !important }
body.pl-presenter .gradio-container { padding-top: 2px !important; padding-bottom: 0 !important;
  max-width: none !important }
body.pl-presenter footer, body.pl-presenter #landing, body.pl-presenter #status,
body.pl-presenter #room-link { display: none !important }
body.pl-presenter #top-bar { min-height: 0; padding: 0 !important; margin: 0 !important }
body.pl-presenter #title p { font-size: 15px; margin: 0 }
body.pl-presenter #look { flex-wrap: nowrap !important; justify-content: flex-end; gap: 4px }
body.pl-presenter #look .block { padding: 2px 8px !important; flex: 0 0 auto !important;
  width: auto !important; min-width: 0 !important }
body.pl-presenter #look label { white-space: nowrap }
/* the bar above a slide takes one line: the slide gets the height (the two boxes side by side) */
body.pl-presenter #look .form { flex-direction: row !important; flex-wrap: nowrap !important;
  gap: 4px !important; border: 0 !important }
body.pl-presenter #top-bar > div:last-child { flex: 0 0 auto !important; min-width: 0 !important }
body.pl-presenter .gradio-container .main { padding-top: 4px !important }
body.pl-presenter .gradio-container main.contain > .column { gap: 6px !important }
body.pl-presenter .gradio-container .main > .wrap { padding-top: 0 !important }
body.pl-presenter #main-row { height: calc(100vh - var(--pl-top, 60px)); flex-wrap: nowrap !important;
  align-items: stretch; gap: 14px }
body.pl-presenter #picture-col { flex: 0 0 63% !important; max-width: 63%; min-width: 0 !important }
body.pl-presenter #controls-col { flex: 1 1 0 !important; min-width: 0 !important;
  overflow-y: auto; overflow-x: hidden; position: relative }
body.pl-presenter #below, body.pl-presenter #shards-plot { display: none !important }
body.pl-presenter #picture-col { flex-wrap: nowrap !important; overflow: hidden }
body.pl-presenter #event-log { font-size: 16px !important; line-height: 1.35; max-height: none }
body.pl-presenter #controls-col button { font-size: 16px !important }
body.pl-presenter #controls-col .tab-container button {
  font-size: 15px !important; padding: 4px 4px !important }
/* the lesson slide: nothing of the teacher's setup, the page's text large; before a lesson
   starts, on its opening page and at its end (pl-lesson-menu, set by ui/motion.js) the lesson
   list and Start stay on the slide, so a teacher can pick a lesson without leaving presenter
   mode. They sit in the top bar, one slim line, so that they take none of the slide's height */
body.pl-presenter.pl-lesson #controls-col .tab-wrapper, body.pl-presenter.pl-lesson #lesson-all,
body.pl-presenter.pl-lesson:not(.pl-lesson-menu) #lesson-choose,
body.pl-presenter.pl-lesson #event-log { display: none !important }
body.pl-presenter.pl-lesson #lesson-choose { order: 0; flex-wrap: nowrap !important }
body.pl-presenter.pl-lesson #lesson-choose { position: fixed; top: 1px; left: 32vw;
  width: min(520px, 40vw); z-index: 60; gap: 6px !important; background: none }
body.pl-presenter.pl-lesson #lesson-choose :is(.block, .container) {
  padding: 0 !important; border: 0 !important; background: none !important; box-shadow: none }
body.pl-presenter.pl-lesson #lesson-choose [data-testid=block-info] { display: none }
body.pl-presenter.pl-lesson #lesson-choose :is(input, button) { font-size: 15px !important;
  min-height: 0 !important; padding-top: 2px !important; padding-bottom: 2px !important }
body.pl-presenter.pl-lesson #lesson-choose :is(.wrap, .wrap-inner) { min-height: 0 !important;
  padding-top: 0 !important; padding-bottom: 0 !important }
body.pl-presenter.pl-lesson #lesson-choose > * { max-height: 30px }
body.pl-presenter.pl-lesson #controls-col { overflow-y: hidden }
body.pl-presenter.pl-lesson #controls-col .tabitem { padding: 0 !important; border: 0 !important }
body.pl-presenter.pl-lesson #controls-col .tabitem > .column { gap: 6px !important }
body.pl-presenter.pl-lesson #lesson-progress { order: 1 }
body.pl-presenter.pl-lesson #lesson-narration { order: 2 }
body.pl-presenter.pl-lesson #lesson-question { order: 3 }
body.pl-presenter.pl-lesson #lesson-nav { order: 4 }
/* the learner's prediction under the question, the page's inputs under its text (issue 35) */
body.pl-presenter.pl-lesson #lesson-inputs { order: 2 }
body.pl-presenter.pl-lesson #lesson-ask { order: 3 }
#lesson-ask { gap: 4px } #lesson-inputs { gap: 8px; flex-wrap: nowrap }
/* one line each on a slide: the label beside its box, not above it */
:is(#lesson-ask, #lesson-inputs) .block { padding: 4px 8px !important }
:is(#lesson-answer label, #lesson-inputs .container) { display: flex; align-items: center; gap: 8px }
:is(#lesson-answer, #lesson-inputs) [data-testid=block-info] { margin: 0 !important; flex: 0 1 auto;
  white-space: nowrap }
:is(#lesson-answer label, #lesson-inputs .container) > :is(div, input) { flex: 1 1 auto; min-width: 0 }
#lesson-pick .wrap { gap: 6px } #lesson-pick label { padding: 2px 10px !important }
body.pl-presenter #lesson-ask :is(input, textarea, label), body.pl-presenter #lesson-inputs input {
  font-size: 18px !important }
body.pl-presenter #lesson-progress .prose, body.pl-presenter #lesson-progress .prose * {
  font-size: 16px !important; line-height: 1.3 }
body.pl-presenter #lesson-narration .prose, body.pl-presenter #lesson-question .prose {
  font-size: var(--slide) !important; line-height: 1.32 }
body.pl-presenter #lesson-narration .prose :is(p, li, td, th, ul, ol, table, code, strong, em),
body.pl-presenter #lesson-question .prose :is(p, li, strong, em, code) {
  font-size: inherit !important; line-height: inherit; margin-top: 0 }
body.pl-presenter #lesson-narration .prose p { margin-bottom: 0.35em }
body.pl-presenter #lesson-narration .prose :is(td, th) { padding: 1px 10px !important }
body.pl-presenter #lesson-narration .prose table { margin: 0.2em 0 0.4em 0 !important }
body.pl-presenter #lesson-narration .prose h3 { font-size: 1.2em !important; margin: 0 0 0.3em 0 }
body.pl-presenter #lesson-narration .prose blockquote { font-size: 1.2em !important }
body.pl-presenter #lesson-nav button { font-size: 0.9em !important; min-height: 0; padding: 6px 10px }
/* a classroom's projector view (/class, "projector view"): the room's picture at presenter size
   beside its link, QR code and numbers; the teacher's settings, buttons, keys and notes hidden */
body.pl-projector :is(#room-open-box, #room-controls, #room-shrink-row, #room-said, #room-keys,
  #room-warning, #room-requests-box, #room-poll-names, #room-lesson, #room-lesson-play,
  #room-lesson-end, #room-view-choice), body.pl-projector footer { display: none !important }
/* a lesson in the room: its page beside the picture, in type the back row reads */
body.pl-projector :is(#room-poll, #room-poll-ask) .prose :is(p, strong, em, li) { font-size: 20px !important }
body.pl-projector #room-poll blockquote, body.pl-projector #room-poll blockquote * {
  font-size: 24px !important }
#room-poll blockquote { border-left: 5px solid #2563eb; padding-left: 0.6em; font-weight: 600;
  margin: 0.3em 0 }
#student-poll-box { border-top: 1px solid #ddd; padding-top: 6px }
body.pl-projector #room-qr svg { width: 96px !important; height: 96px !important }
body.pl-projector #room-projector { padding: 0 8px !important; min-height: 0 }
body.pl-projector #room-lesson-row { margin: 0 !important; min-height: 0 }
/* the teacher's lesson picker takes its row (a title whole), Play / Next / End under it */
body:not(.pl-projector) #room-lesson-row > .form { min-width: 100% !important }
body.pl-projector #room-joined .prose * { font-size: 14px !important; line-height: 1.25 }
body.pl-projector .gradio-container { padding-top: 2px !important; max-width: none !important }
body.pl-projector #room-main { height: calc(100vh - var(--pl-top, 60px)); flex-wrap: nowrap !important }
body.pl-projector #room-picture-col { flex: 0 0 66% !important; max-width: 66%; min-width: 0 !important }
body.pl-projector #room-side { overflow: hidden; font-size: 16px }
body.pl-projector #room-side td { padding: 2px 6px !important }
/* the key sentence of a lesson page: a quote in the page's Markdown (lessons/page_text.py) */
#lesson-narration blockquote { border-left: 5px solid #2563eb; margin: 0.2em 0 0.45em 0;
  padding: 0.15em 0 0.15em 0.6em; font-weight: 600; color: #111827; font-style: normal;
  font-size: 1.08em; background: none }
#lesson-narration blockquote p { margin: 0 }
/* the block inspector opens beside the picture, not a screen under it: in the playground it
   sits right under the controls and the step's events; with a lesson or Serving in front
   (whose text or controls fill the column) it opens over them, under the tabs, until closed */
#controls-col { position: relative }
body:is(.pl-lesson, .pl-serving) #inspector:has(> .label-wrap.open) { position: absolute !important;
  top: 46px; left: 0; right: 0; z-index: 100; max-height: calc(100% - 46px); overflow-y: auto;
  box-shadow: 0 4px 18px rgba(15,23,42,.25); background: var(--block-background-fill, #fff) }
/* on a phone, whose column starts with the lesson's place and Back / Next, it opens under them
   (ui/motion.js sets --pl-nav-bottom there only: a body rule in a media query is never matched,
   as Gradio scopes it under its container) */
body.pl-lesson:not(.pl-presenter) #inspector:has(> .label-wrap.open) { max-height: 88vh;
  top: var(--pl-nav-bottom, 46px) }
/* on a slide the column is the page's key sentence, its question and Next: the inspector opens
   over the lower part of the picture instead, until it is closed */
body.pl-presenter.pl-lesson #inspector:has(> .label-wrap.open) { position: fixed !important;
  top: auto; bottom: 6px; left: 34px; right: auto; width: min(58vw, 900px); max-height: 52vh }
#top-bar .gap, #top-bar .form { gap: 2px }
#landing p { margin: 2px 0 0 0; color: #334155 }
#landing a { display: inline-block; margin-left: 6px; padding: 1px 10px; border-radius: 6px;
  background: #2563eb; color: #fff !important; text-decoration: none; font-weight: 600 }
@media (max-width: 600px) {
  #controls-col .tab-container button { font-size: 0.85em !important; padding: 4px 2px !important }
  /* the picture is drawn for the phone's width (viz/fit.py: tokens whole in their slots, or the
     selected sequence's listed under the pool). A lesson on a phone: where it is, Back / Next
     and the page's text right under the picture, the lesson's choice after them */
  #controls-col #lesson-progress { order: 1 }
  #controls-col #lesson-nav { order: 2; flex-wrap: nowrap !important }
  #controls-col #lesson-nav button { min-width: 0 !important; flex: 1 1 0 !important; padding: 6px 4px }
  #controls-col #lesson-narration { order: 3 }
  #controls-col #lesson-question { order: 4 }
  #controls-col #lesson-ask { order: 4 }
  #controls-col #lesson-inputs { order: 3 }
  #controls-col #lesson-choose { order: 5 }
  #controls-col #lesson-choose > .form { min-width: 100% !important }  /* a title whole, Start under it */
  #controls-col #lesson-choose > button { flex: 1 1 auto !important }
  #controls-col #lesson-all { order: 6 }
  .gradio-container, .gradio-container .main, .gradio-container .wrap { padding-left: 4px !important;
    padding-right: 4px !important }
}
"""

# JS run in the page when a checkbox changes: a class on <body> switches the look, no round trip
PRESENTER_JS = "(on) => { document.body.classList.toggle('pl-presenter', !!on); return on; }"
REDUCE_MOTION_JS = "(on) => { document.body.classList.toggle('pl-reduce-motion', !!on); return on; }"
