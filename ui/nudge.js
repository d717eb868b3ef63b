// The nudge (ui/stream_nudge.py says why): while something on the page has been under way for
// NUDGE_AFTER ms (a status tracker's timer exists), press the hidden #pl-nudge every NUDGE_AFTER
// ms. Its request opens the page's event stream again where Gradio's client lost it, and an
// answer waiting on the server arrives; where nothing was lost it costs one no-op request.
// Hidden timers count: in presenter mode Next's only timer is in the hidden status line.
(() => {
  const NUDGE_AFTER = 4000;
  let busySince = null, lastNudge = 0;
  setInterval(() => {
    const busy = document.querySelector('.progress-text') !== null;
    const now = performance.now();
    if (!busy) { busySince = null; return; }
    busySince ??= now;
    if (now - busySince >= NUDGE_AFTER && now - lastNudge >= NUDGE_AFTER) {
      lastNudge = now;
      document.querySelector('#pl-nudge')?.click();
    }
  }, 500);
})();
