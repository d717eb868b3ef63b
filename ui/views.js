// The views of the run under the picture (ui/views_panel.py): clicks on them go to Python.
// A cell of the request timeline selects its request and goes to its step, a lane's label
// selects (and opens or closes) its request: both through a hidden textbox + button of the
// views panel. A cell of the prefix tree selects its block in the picture, through the
// picture's own click box (#pl-click, ui/inspector_panel.py), as a click on the block would.
// Run once, by the panel's HTML element when the page loads.
(() => {
  if (window.plViews) return;
  window.plViews = true;

  function send(boxSel, goSel, action) {
    const box = document.querySelector(`${boxSel} textarea, ${boxSel} input`);
    const go = document.querySelector(goSel);
    if (!box || !go) return;
    box.value = action + '|' + Date.now(); // always a new value: a second click counts too
    box.dispatchEvent(new Event('input', { bubbles: true }));
    setTimeout(() => go.click(), 0);
  }

  function cellData(pt) {
    let cd = pt.customdata;
    if (cd === undefined && Array.isArray(pt.pointIndex) && pt.data.customdata) {
      cd = pt.data.customdata[pt.pointIndex[0]][pt.pointIndex[1]];
    }
    return cd;
  }

  function onClick(ev, gd) {
    const pt = ev && ev.points && ev.points[0];
    if (!pt || !pt.data) return;
    const meta = (gd.layout && gd.layout.meta) || {};
    const name = pt.data.name;
    if (name === 'timeline cells' && meta.rows && meta.columns) {
      const row = meta.rows[Math.round(pt.y)];
      const step = meta.columns[Math.round(pt.x)];
      if (row && step !== undefined) send('#pl-view-click', '#pl-view-go', `cell:${row[0]}:${step}`);
    } else if (name === 'lanes') {
      const cd = cellData(pt);
      if (cd) send('#pl-view-click', '#pl-view-go', `lane:${cd[0]}`);
    } else if (name === 'prefix tree') {
      const cd = cellData(pt);
      if (!cd) return;
      if (cd[0] >= 0) send('#pl-click', '#pl-click-go', `block:${cd[0]}`);
      else if (cd[1] >= 0) send('#pl-click', '#pl-click-go', `tier:${cd[1]}`);
    }
  }

  // Gradio draws a new plot element whenever a callback returns a figure: bind each one as soon
  // as it is drawn (ui/draws.js says so), and on a poll besides
  const bind = () => {
    document.querySelectorAll('#view-plot .js-plotly-plot').forEach((gd) => {
      if (!gd.on || gd.__plViews === gd._ev) return;
      gd.on('plotly_click', (ev) => onClick(ev, gd));
      gd.__plViews = gd._ev;
    });
  };
  document.addEventListener('pl-drawn', bind);
  setInterval(bind, 120);
})();
