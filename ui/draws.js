// Plotly draws in the page: one draw per figure Gradio sends, the main picture first.
// Loaded once in the page's <head>, beside ui/motion.js (ui/theme.py).
//
// Why: Gradio 6's Plot component keys its plotly child on the figure's JSON, so an update first
// re-draws the old element (Plotly.react, a whole draw) and then mounts a new element and draws
// it again from scratch; the old element is dropped in the same task. Back / Next with a view
// under the picture drew four figures for two, and the picture could not paint until all four
// (and the view) were done (bench/NOTES.md, "Back / Next in the browser"). Here Plotly.react on a
// plot of the page is deferred to a task of its own: by then the old element is gone and only
// the element that stays is drawn, once; plots are drawn one per task in the order Gradio
// updated them, with a frame and Gradio's own work between, so the picture (the first output of
// every handler, ui/page.py) is painted, and the status line says the click is done, before the
// view under it is drawn.
(() => {
  if (window.plDraws) return; // the head may be put into the document more than once
  window.plDraws = true;
  const queue = new Map(); // plot element -> [args, resolves]: the latest figure for each
  let running = false;
  let idle = []; // waiting for the queue to be drawn (window.plDrawsIdle)

  // the next plot waits for a frame (this one painted) and for Gradio to finish the update it
  // came with (its status line's "processing" cleared: idle), at most IDLE_MS
  const IDLE_MS = 150;
  const STUCK_MS = 3000;
  const settle = () => new Promise((r) => requestAnimationFrame(() => (window.requestIdleCallback
    ? requestIdleCallback(() => r(), { timeout: IDLE_MS }) : setTimeout(r, 0))));

  async function drain(react) {
    running = true;
    await new Promise((r) => setTimeout(r, 0)); // Gradio's update (and its unmounts) ends first
    try {
      while (queue.size) {
        const [gd, [args, resolves]] = queue.entries().next().value;
        queue.delete(gd);
        let out = gd;
        // an element Gradio has dropped is never drawn: its replacement is in the queue
        if (gd.isConnected) {
          try {
            // a draw whose promise never settles must not hold up every later figure
            out = await Promise.race([react(gd, ...args),
              new Promise((r) => setTimeout(() => r(gd), STUCK_MS))]);
          } catch (err) { // one figure's failure must not stop the others being drawn
            console.warn('PagedLab draw:', err);
          }
          // the page's click handlers bind a new plot at once (ui/motion.js, ui/views.js), not
          // on their next poll: a click on the drawn picture must not be lost
          document.dispatchEvent(new CustomEvent('pl-drawn'));
          if (queue.size) await settle(); // paint this plot before the next is drawn
        }
        resolves.forEach((r) => r(out));
      }
    } finally {
      running = false;
      idle.splice(0).forEach((r) => r());
    }
  }

  // Resolves once every figure sent so far is drawn: the followers of the view (ui/motion.js)
  // ask the server after the picture is painted, not in the same task as its draw.
  window.plDrawsIdle = () => new Promise((r) => setTimeout(() => {
    if (running || queue.size) idle.push(r);
    else r();
  }, 0));

  function install() {
    const P = window.Plotly;
    if (!P || P.plDeferred || typeof P.react !== 'function') return !!P?.plDeferred;
    const react = P.react.bind(P);
    P.react = function (gd, ...args) {
      if (!(gd instanceof Element)) return react(gd, ...args); // an id or a figure: as Plotly does
      const had = queue.get(gd);
      queue.delete(gd); // a newer figure for the same element replaces the waiting one (and
      queue.set(gd, [args, had ? had[1] : []]); // moves it back: drawn in the order of updates)
      const done = new Promise((r) => queue.get(gd)[1].push(r));
      if (!running) drain(react);
      return done;
    };
    // Gradio asks for a resize right after each draw: an element it has dropped has none to do
    const resize = P.Plots.resize.bind(P.Plots);
    P.Plots.resize = (gd) => (gd instanceof Element && !gd.isConnected ? Promise.resolve(gd)
      : resize(gd));
    P.plDeferred = true;
    return true;
  }

  // Gradio loads plotly (and sets window.Plotly) with its first plot: patch it as soon as it is
  // there, before the figures that follow
  const poll = setInterval(() => { if (install()) clearInterval(poll); }, 20);
})();
