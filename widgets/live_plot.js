// Front end of widgets/live_plot.py: draws a LivePlot with the plotly.js shipped by the plotly
// package (sent once as the `_plotly` trait, imported once per page, never from a CDN).
//
// The live data is on the plot's channel, a core widget model (see live_plot.py for why it is
// not on this anywidget's own model). Every view reconciles against the channel's traits (look,
// delta, state) instead of trusting that it saw every message: on any change, and once a second
// in case a change event never reached it. A delta numbered right after what the view drew is
// appended with Plotly.extendTraces; a gap (the view rendered mid-stream, or lost a message)
// asks the kernel for the whole state (and the look). A FigureView's look holds the whole figure
// (`look.whole`), redrawn as one piece on each revision. Each view records, per update, the
// kernel's time stamp and Date.now() once drawn, so tests and benches read the kernel-to-page
// latency from the page.

const CONFIG = { displaylogo: false, responsive: true };
const LOG_LIMIT = 5000;
const TRAITS = ["look", "delta", "state"];

function loadPlotly(source) {
  if (!globalThis.__workbenchPlotly) {
    const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
    globalThis.__workbenchPlotly = import(/* webpackIgnore: true */ url).then((module) => {
      URL.revokeObjectURL(url);
      return module.default || globalThis.Plotly;
    });
  }
  return globalThis.__workbenchPlotly;
}

function traceOf(style, points) {
  const trace = { ...style, x: [...points.x], y: [...points.y] };
  if (points.text && points.text.length) trace.text = [...points.text];
  return trace;
}

async function render({ model, el }) {
  const gd = document.createElement("div");
  gd.className = "wb-live-plot";
  gd.dataset.name = model.get("name");
  el.appendChild(gd);
  const view = { seq: -1, lookRev: -1, snapshots: 0, deltas: 0, asked: -1, askedAt: 0, log: [], errors: [] };
  gd.wbLive = view; // read by tests and benches: what this page drew, and when
  const Plotly = await loadPlotly(model.get("_plotly"));
  const channel = await model.widget_manager.get_model(model.get("channel_id"));

  async function drawAll(look, traces, seq) {
    // Whole-figure mode (FigureView): the look's traces are complete and carry their own data.
    // Copies, since plotly writes into what it is given (autorange, zoom) and the look is the
    // model's own value, shared by every view of it on the page.
    const data = look.whole
      ? structuredClone(look.styles)
      : look.styles.map((style, i) => traceOf(style, traces[i] || { x: [], y: [] }));
    const layout = structuredClone(look.layout);
    await Plotly.react(gd, data, layout, CONFIG);
    view.seq = seq;
    view.lookRev = look.rev;
  }

  function currentTraces() {
    return (gd.data || []).map((t) => ({ x: t.x || [], y: t.y || [], text: t.text || [] }));
  }

  async function applyDelta(delta) {
    const plain = { x: [], y: [], idx: [] };
    const texted = { x: [], y: [], text: [], idx: [] };
    for (const [index, keep, x, y, text] of delta.traces) {
      const trace = gd.data[index];
      if (trace.x.length !== keep) {
        // The tail of a decimated trace was redrawn: drop it, then append the new tail.
        trace.x = trace.x.slice(0, keep);
        trace.y = trace.y.slice(0, keep);
        if (Array.isArray(trace.text)) trace.text = trace.text.slice(0, keep);
      }
      const group = text.length || Array.isArray(trace.text) ? texted : plain;
      if (group === texted && !Array.isArray(trace.text)) trace.text = [];
      group.x.push(x);
      group.y.push(y);
      if (group === texted) group.text.push(text);
      group.idx.push(index);
    }
    if (plain.idx.length) await Plotly.extendTraces(gd, { x: plain.x, y: plain.y }, plain.idx);
    if (texted.idx.length) {
      await Plotly.extendTraces(gd, { x: texted.x, y: texted.y, text: texted.text }, texted.idx);
    }
    view.seq = delta.seq;
    view.deltas += 1;
    view.log.push({ seq: delta.seq, kernel_ms: delta.t, drawn_ms: Date.now() });
    if (view.log.length > LOG_LIMIT) view.log.splice(0, view.log.length - LOG_LIMIT);
  }

  async function reconcile() {
    const look = channel.get("look");
    const state = channel.get("state") || {};
    const delta = channel.get("delta") || {};
    if (!look || !look.styles) return;
    const stateSeq = state.traces ? state.seq : -1;
    const deltaSeq = delta.traces ? delta.seq : -1;
    if (view.seq < 0 || stateSeq > view.seq) {
      if (stateSeq >= 0) {
        await drawAll(look, state.traces, stateSeq);
        view.snapshots += 1;
        view.log.push({ seq: stateSeq, kernel_ms: state.t, drawn_ms: Date.now(), snapshot: true });
      } else if (view.seq < 0) {
        await drawAll(look, [], 0);
      }
    }
    if (look.rev !== view.lookRev) await drawAll(look, currentTraces(), view.seq);
    if (deltaSeq > view.seq) {
      if (delta.base === view.seq) {
        await applyDelta(delta);
      } else if (view.asked < deltaSeq || Date.now() - view.askedAt > 3000) {
        // One request per gap (again after 3 s without an answer); the reply is a new `state`.
        view.asked = deltaSeq;
        view.askedAt = Date.now();
        channel.send({ type: "snapshot", have: view.seq });
      }
    }
    gd.dataset.seq = String(view.seq);
    gd.dataset.rev = String(view.lookRev);
  }

  let queue = Promise.resolve();
  const schedule = () => {
    queue = queue.then(reconcile).catch((err) => {
      view.errors.push(String(err));
      console.error("workbench live plot:", err);
    });
  };
  for (const trait of TRAITS) channel.on(`change:${trait}`, schedule);
  const timer = setInterval(schedule, 1000);
  schedule();
  return () => {
    clearInterval(timer);
    for (const trait of TRAITS) channel.off(`change:${trait}`, schedule);
    Plotly.purge(gd);
  };
}

export default { render };
