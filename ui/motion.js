// PagedLab's picture in the page: clicks on blocks and table rows go to Python, and the last
// step's change moves (viz/overlays.py names the traces). Loaded once in the page's <head>.
(() => {
  // Gradio may put the page's head into the document more than once: one copy of this script
  // must run, or a clicker's key presses Next twice (it skipped lesson pages).
  if (window.plMotion) return;
  window.plMotion = true;
  const DURATION = 450; // ms: every motion ends within about half a second
  // The name of the controls' tab in front ('' before the tabs render): read here and by the
  // vLLM tab's timer (ui/vllm_panel.py TICK_JS), which rests while another tab is in front.
  window.plFrontTab = () => (document.querySelector(
    '#controls-col [role=tab][aria-selected=true], #controls-col [role=tab].selected')?.innerText ?? '').trim();
  const reduced = () => document.body.classList.contains('pl-reduce-motion') ||
    window.matchMedia('(prefers-reduced-motion: reduce)').matches;

  // The picture's click -> a hidden textbox + a hidden button wired to a Python event.
  function send(action) {
    const box = document.querySelector('#pl-click textarea, #pl-click input');
    const go = document.querySelector('#pl-click-go');
    if (!box || !go) return;
    box.value = action + '|' + Date.now(); // always a new value, so a second click counts too
    box.dispatchEvent(new Event('input', { bubbles: true }));
    setTimeout(() => go.click(), 0);
  }

  // A lesson's block question (ui/lesson_ask.py marks its answer box): the clicked block is the
  // learner's prediction, written into the box; the inspector stays closed over the question.
  function pickBlock(id) {
    const ask = document.querySelector('#lesson-answer.pl-pick-block');
    const box = ask && ask.offsetParent !== null && ask.querySelector('input, textarea');
    if (!box) return false;
    box.value = 'block ' + id;
    box.dispatchEvent(new Event('input', { bubbles: true }));
    return true;
  }

  // the picture's traces a click acts on ('free blocks': a folded run's id cells, drawn while
  // a lesson asks which block)
  const CLICKABLE = ['pool', 'free blocks', 'block tables', 'cpu pool', 'cpu tier'];

  function onClick(ev, gd) {
    const pt = ev && ev.points && ev.points[0];
    if (!pt || !pt.data) return;
    let name = pt.data.name;
    let cd = pt.customdata;
    if (cd === undefined && Array.isArray(pt.pointIndex) && pt.data.customdata) {
      cd = pt.data.customdata[pt.pointIndex[0]][pt.pointIndex[1]];
    }
    if (!CLICKABLE.includes(name)) { // an outline drawn over a cell (a freed block's) took it
      const hit = cellAt(gd, ev);
      if (!hit) return;
      [name, cd] = hit;
    }
    if (!cd) return;
    const block = name === 'pool' || name === 'free blocks';
    if (block && pickBlock(cd[0])) return;
    if (block) send('block:' + cd[0]);
    else if (name === 'block tables') send('seq:' + cd[0]);
    else if (name === 'cpu pool') send('cpu:' + cd[0]);
    else if (name === 'cpu tier') send('tier:' + cd[0]);
  }

  // [trace name, customdata] of the clickable cell under the pointer (heatmaps: x holds the
  // cells' edges, y their rows' centres), or null
  function cellAt(gd, ev) {
    const e = ev && ev.event, drag = gd && gd.querySelector('.nsewdrag');
    const xa = gd && gd._fullLayout && gd._fullLayout.xaxis, ya = gd && gd._fullLayout.yaxis;
    if (!e || !drag || !xa || !ya) return null;
    const area = drag.getBoundingClientRect();
    const x = xa.p2l(e.clientX - area.left), y = ya.p2l(e.clientY - area.top);
    for (const t of gd.data) {
      if (!CLICKABLE.includes(t.name) || !t.customdata || !t.x || !t.y) continue;
      const c = t.x.findIndex((v, i) => i + 1 < t.x.length && v <= x && x <= t.x[i + 1]);
      const r = t.y.findIndex((v) => Math.abs(v - y) < 0.5);
      const cd = c >= 0 && r >= 0 && t.customdata[r] ? t.customdata[r][c] : null;
      if (cd) return [t.name, cd];
    }
    return null;
  }

  // The svg group of a scatter trace, found by its name.
  function traceNode(gd, name) {
    const scatter = gd.data.filter((t) => (t.type || 'scatter') === 'scatter');
    const k = scatter.findIndex((t) => t.name === name);
    return k < 0 ? null : gd.querySelectorAll('.scatterlayer > .trace')[k] || null;
  }

  function animate(gd) {
    if (reduced()) return;
    const opts = { duration: DURATION, easing: 'ease-out' };
    const play = (name, frames) => {
      const node = traceNode(gd, name);
      if (node) node.animate(frames, opts);
    };
    play('new block cover', [{ opacity: 1 }, { opacity: 0 }]); // the new block fades in
    play('evicted ghost', [{ opacity: 1 }, { opacity: 0 }]); // the evicted content fades out
    play('rejected ghost', [{ opacity: 0.8 }, { opacity: 0 }]); // a rejected draft clears
    play('prefix hit flash', [{ opacity: 0 }, { opacity: 0.9 }, { opacity: 0 }, { opacity: 0.9 }, { opacity: 0 }]);
    play('new block', [{ opacity: 0 }, { opacity: 1 }]);
    const cow = traceNode(gd, 'copy-on-write'); // the arrow draws itself from source to copy
    if (cow) {
      cow.querySelectorAll('path.js-line').forEach((p) => {
        const len = p.getTotalLength();
        p.animate([{ strokeDasharray: `${len}px`, strokeDashoffset: `${len}px` },
          { strokeDasharray: `${len}px`, strokeDashoffset: '0px' }], opts);
      });
      cow.querySelectorAll('.points path').forEach((p) =>
        p.animate([{ opacity: 0 }, { opacity: 0, offset: 0.7 }, { opacity: 1 }], opts));
    }
    const slide = traceNode(gd, 'swap slide'); // swapped blocks slide to their new place
    const idx = gd.data.findIndex((t) => t.name === 'swap slide');
    if (slide && idx >= 0) {
      const xa = gd._fullLayout.xaxis;
      const ya = gd._fullLayout.yaxis;
      const from = gd.data[idx].customdata || [];
      slide.querySelectorAll('.points path').forEach((p, i) => {
        const m = /translate\(([-\d.e]+),\s*([-\d.e]+)\)/.exec(p.getAttribute('transform') || '');
        if (!m || !from[i]) return;
        const [x, y] = [parseFloat(m[1]), parseFloat(m[2])];
        const sx = xa.c2p(from[i][0]) - xa.c2p(gd.data[idx].x[i]) + x;
        const sy = ya.c2p(from[i][1]) - ya.c2p(gd.data[idx].y[i]) + y;
        p.animate([{ transform: `translate(${sx}px, ${sy}px)` }, { transform: `translate(${x}px, ${y}px)` }], opts);
      });
    }
  }

  // Gradio (re)draws the figure whenever a callback returns one: bind and animate each new one,
  // as soon as it is drawn (ui/draws.js says so) and on a poll besides.
  const handleDrawn = () => {
    document.querySelectorAll('#pool-plot .js-plotly-plot').forEach((gd) => {
      if (!gd.on || !gd._fullLayout) return;
      if (gd.__plEvents !== gd._ev) {
        gd.on('plotly_click', (ev) => onClick(ev, gd));
        // a sequence's name left of its table row (viz/block_tables.py names it "seq:<id>")
        gd.on('plotly_clickannotation', (ev) => {
          const m = /^seq:(\d+)$/.exec((ev && ev.annotation && ev.annotation.name) || '');
          if (m) send('seq:' + m[1]);
        });
        gd.__plEvents = gd._ev;
      }
      // Gradio may draw a redraw of the same step (a selection, presenter mode) into a new
      // element: remember the last step animated on the page, not per element
      const key = gd.layout && gd.layout.meta && gd.layout.meta.anim;
      if (key && key !== window.plAnimated) {
        const first = window.plAnimated === undefined;
        window.plAnimated = key;
        try {
          animate(gd);
        } catch (err) { // motion is a garnish: a failure must never cost the clicks
          console.warn('PagedLab motion:', err);
        }
        // on a phone the controls sit under the picture: after an action (not the page's first
        // picture) bring the picture back into view, so the change is seen without scrolling
        const box = gd.getBoundingClientRect();
        if (!first && window.innerWidth < 700 && (box.top < -40 || box.top > window.innerHeight * 0.5)) {
          gd.scrollIntoView({ block: 'start', behavior: document.body.classList.contains(
            'pl-reduce-motion') ? 'auto' : 'smooth' });
        }
      }
    });
  };
  document.addEventListener('pl-drawn', handleDrawn);
  setInterval(handleDrawn, 100);

  // The picture's box: the page tells Python how much room the picture has, so that it is drawn
  // to fit (viz/fit.py): in presenter mode the whole height of the slide beside the text, else
  // the column's width (height 0: as tall as it needs). Sent when it changes, not on every frame.
  let sentBox = '';
  let sentRoom = '';
  let boxTimer = null;
  // the room of the picture column `col` as "WxH" (height 0 outside the slide / projector view)
  function roomOf(col, slide) {
    const r = col.getBoundingClientRect();
    // the slide's row starts under the top bar: its height is the rest of the screen (ui/theme.py)
    const top = `${Math.ceil(r.top + window.scrollY + 18)}px`;
    if (slide && document.body.style.getPropertyValue('--pl-top') !== top) {
      document.body.style.setProperty('--pl-top', top);
    }
    const w = Math.round(r.width);
    const h = slide ? Math.max(0, Math.round(window.innerHeight - Math.max(r.top, 0) - 18)) : 0;
    return [w, h];
  }
  const changed = (old, w, h) => {
    if (!old) return true;
    const [ow, oh] = old.split('x').map(Number);
    return Math.abs(ow - w) >= 6 || Math.abs(oh - h) >= 6;
  };
  function measureBox() {
    const col = document.querySelector('#picture-col');
    const box = document.querySelector('#pl-box textarea, #pl-box input');
    const go = document.querySelector('#pl-box-go');
    if (col && box && go && col.offsetParent !== null) {
      const slide = document.body.classList.contains('pl-presenter');
      const [w, h] = roomOf(col, slide);
      // a picture drawn for another box (a report lost while the page loaded, or overtaken by
      // a later one) asks again
      const gd = document.querySelector('#pool-plot .js-plotly-plot');
      const drawn = gd?._fullLayout && gd.layout?.meta?.fit ? gd.layout.meta.fit.box : undefined;
      const stale = drawn !== undefined && (!drawn || Math.abs(drawn[0] - w) > 6 ||
        Math.abs(drawn[1] - h) > 6) && Date.now() - (window.plBoxAt || 0) > 800 &&
        (window.plAsked || 0) < 5; // a few times, not forever (a view with no picture to redraw)
      if (w >= 100 && (changed(sentBox, w, h) || stale)) {
        window.plAsked = changed(sentBox, w, h) ? 0 : (window.plAsked || 0) + 1;
        window.plBoxAt = Date.now();
        sentBox = `${w}x${h}`;
        // newer reports win, and say whether the page is a slide (ui/picture_box.py)
        box.value = `${sentBox}#${window.plBoxAt}#${slide ? 1 : 0}`;
        box.dispatchEvent(new Event('input', { bubbles: true }));
        setTimeout(() => go.click(), 0);
      }
    }
    // a classroom's projector page: its timer reads the box on its next tick
    const roomCol = document.querySelector('#room-picture-col');
    const roomBox = document.querySelector('#room-box textarea, #room-box input');
    if (roomCol && roomBox && roomCol.offsetParent !== null) {
      const [w, h] = roomOf(roomCol, document.body.classList.contains('pl-projector'));
      if (w >= 100 && changed(sentRoom, w, h)) {
        sentRoom = roomBox.value = `${w}x${h}`;
        roomBox.dispatchEvent(new Event('input', { bubbles: true }));
      }
    }
  }
  const measureSoon = () => { clearTimeout(boxTimer); boxTimer = setTimeout(measureBox, 80); };
  window.addEventListener('resize', measureSoon);
  // the body's look classes (presenter mode, the lesson in front) change the picture's room
  new MutationObserver(measureSoon).observe(document.body, { attributes: true, attributeFilter: ['class'] });
  setInterval(measureBox, 1000); // a late page (Gradio draws its blocks after the script runs)

  // The status line's text changed (an operation, Back / Next, a lesson page): the followers of
  // the view are told by a hidden button. Gradio fires a Markdown's own change event again
  // without a change (gradio-app/gradio#9103's family), which kept the page calling the server
  // in a loop that never came to rest.
  // Told at once when the status line changes (an observer), and by a slow poll besides (Gradio
  // may draw the status element anew, out of the observer's sight).
  let statusSeen = null, statusWatched = null;
  const follow = () => {
    const text = document.querySelector('#status .prose')?.innerText;
    const go = document.querySelector('#pl-follow');
    if (text === undefined || !go || text === statusSeen) return;
    statusSeen = text;
    // after the figures of the same update are drawn (ui/draws.js): the followers' requests
    // would otherwise run in the task that paints the picture
    (window.plDrawsIdle ? window.plDrawsIdle() : Promise.resolve()).then(() => go.click());
  };
  const status = new MutationObserver(follow);
  setInterval(() => {
    const el = document.querySelector('#status');
    if (el && el !== statusWatched) {
      statusWatched = el;
      status.disconnect();
      status.observe(el, { subtree: true, childList: true, characterData: true });
    }
    follow();
  }, 250);

  // The lesson in front: the Lessons tab selected. Presenter mode then lays the page out as a
  // slide (ui/theme.py): the picture and the page's text, nothing else.
  setInterval(() => {
    const tab = window.plFrontTab();
    const lesson = tab === 'Lessons', serving = tab === 'Serving', vllm = tab === 'vLLM';
    if (document.body.classList.contains('pl-lesson') !== lesson
        || document.body.classList.contains('pl-serving') !== serving
        || document.body.classList.contains('pl-vllm') !== vllm) {
      // the class swaps the session's picture and vLLM's (ui/theme.py): a figure drawn while
      // hidden took Plotly's default width, so the one that shows now is fitted again
      if (document.body.classList.contains('pl-vllm') !== vllm) {
        requestAnimationFrame(() => window.dispatchEvent(new Event('resize')));
      }
      document.body.classList.toggle('pl-lesson', lesson);
      document.body.classList.toggle('pl-serving', serving);
      document.body.classList.toggle('pl-vllm', vllm);
      // an inspector left open in another tab would open over this tab's own controls
      document.querySelector('#inspector > .label-wrap.open')?.click();
    }
    // the lesson list and Start on the slide: before a lesson starts, on its opening page, at
    // its end (a teacher in presenter mode picks the next lesson there)
    const progress = document.querySelector('#lesson-progress')?.innerText ?? '';
    const menu = !/page [1-9]\d* of/.test(progress) || progress.includes('the end');
    document.body.classList.toggle('pl-lesson-menu', menu);
    // on a phone the lesson's place and Back / Next come first in the column: the inspector
    // opens under them (ui/theme.py), so a student can turn the page with it open
    const nav = document.querySelector('#lesson-nav'), col = document.querySelector('#controls-col');
    const phone = window.innerWidth <= 600 && lesson && nav && col && nav.offsetParent !== null;
    const under = phone
      ? `${Math.ceil(nav.getBoundingClientRect().bottom - col.getBoundingClientRect().top + 6)}px` : '';
    if (document.body.style.getPropertyValue('--pl-nav-bottom') !== under) {
      if (under) document.body.style.setProperty('--pl-nav-bottom', under);
      else document.body.style.removeProperty('--pl-nav-bottom');
    }
  }, 150);

  // A presentation clicker sends the arrow keys or Page Down / Up: they press the lesson's Next
  // and Back. Not while typing in a text box or moving a slider (the keys are theirs then); a
  // ticked checkbox (presenter mode) keeps the focus but takes no arrows.
  const KEYS = { ArrowRight: '#lesson-next', PageDown: '#lesson-next', ArrowLeft: '#lesson-back',
    PageUp: '#lesson-back' };
  const typing = (el) => el && (el.tagName === 'TEXTAREA' || el.isContentEditable ||
    (el.tagName === 'INPUT' && !['checkbox', 'radio', 'button'].includes(el.type)));
  // A dropdown's box is a text input too, focused (its list open) as soon as it is clicked: a
  // teacher who clicked into a lesson page's model picker and then pressed the clicker got no
  // page. Its list takes Up and Down; Left, Right and the Page keys turn the page, and the
  // focus leaves the box (its list closes) so that the next press finds the page.
  const dropdown = (el) => el && el.tagName === 'INPUT' && el.hasAttribute('aria-expanded');
  document.addEventListener('keydown', (e) => {
    const target = KEYS[e.key];
    const el = document.activeElement;
    const picker = dropdown(el);
    if (!target || (!picker && typing(el))) return;
    const b = document.querySelector(target);
    if (b && b.offsetParent !== null) {
      e.preventDefault(); // Page Down would also scroll the page away from the picture
      if (picker) { // its list closes (its own Escape: a blur alone leaves it open over the
        // next page), and the focus leaves it, so the next key finds the page, not the box
        el.dispatchEvent(new KeyboardEvent('keydown', { key: 'Escape', bubbles: true }));
        el.blur();
      }
      b.click();
    }
  });
})();
