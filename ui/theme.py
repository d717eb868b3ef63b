"""The page's look: one theme for teaching (type, spacing, the picture first), presenter mode
(large type everywhere) and the script that makes the picture clickable and moving
(ui/motion.js). app.py passes CSS, HEAD and THEME to Gradio's launch()."""

from __future__ import annotations

import os

import gradio as gr

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "motion.js"), encoding="utf-8") as f:
    HEAD = f"<script>\n{f.read()}\n</script>"

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
   (recorded views) end before it shows */
#pool-plot { transition: opacity .15s }
body:has(#status [data-testid=status-tracker]:not(.hide)) #pool-plot {
  opacity: .55; transition: opacity .2s .3s }
/* zoom tools: the picture is fixed */
#pool-plot .modebar-container, #room-plot .modebar-container { display: none !important }
#status p { margin: 0; color: #5f6b7a }
#event-log { max-height: 320px; overflow-y: auto }
#controls-col .tab-container button, #controls-col button { white-space: nowrap }
#controls-col .tab-container button { padding: 4px 9px !important; min-width: 0 !important }
/* Presenter mode, for a projector at 1280 x 720 and up: what the class reads (the lesson's
   narration, the step's events, the picture, which draws its own large type) grows; the
   teacher's controls stay compact so that the tabs, the picture and the sentence about the
   step fit on one screen without scrolling. */
.presenter { font-size: 1.3em !important; line-height: 1.4 }
body.pl-presenter #title p { font-size: 1.05em }
body.pl-presenter #landing { display: none }
body.pl-presenter #status p { font-size: 1.0em }
body.pl-presenter #lesson-progress, body.pl-presenter #lesson-question,
body.pl-presenter #event-log { font-size: 1.15em !important; line-height: 1.4 }
body.pl-presenter #controls-col button { font-size: 1.05em !important }
body.pl-presenter #controls-col .tab-container button {
  font-size: 0.95em !important; padding: 4px 4px !important }
#top-bar .gap, #top-bar .form { gap: 2px }
#landing p { margin: 2px 0 0 0; color: #334155 }
#landing a { display: inline-block; margin-left: 6px; padding: 1px 10px; border-radius: 6px;
  background: #2563eb; color: #fff !important; text-decoration: none; font-weight: 600 }
@media (max-width: 600px) {
  #controls-col .tab-container button { font-size: 0.85em !important; padding: 4px 3px !important }
  /* a phone's slots are ~8 px wide: their token text (10 px type) would overlap; colours and the
     block tables stay, and a tap on a block opens the inspector with its tokens */
  #pool-plot .heatmaplayer text[style*="font-size: 10px"] { display: none }
  .gradio-container, .gradio-container .main, .gradio-container .wrap { padding-left: 4px !important;
    padding-right: 4px !important }
}
"""

# JS run in the page when a checkbox changes: a class on <body> switches the look, no round trip
PRESENTER_JS = "(on) => { document.body.classList.toggle('pl-presenter', !!on); return on; }"
REDUCE_MOTION_JS = "(on) => { document.body.classList.toggle('pl-reduce-motion', !!on); return on; }"
