/* Dashboard charts: uPlot panels for a run (live over a WebSocket) and for a comparison of runs. */
"use strict";
const Studio = (() => {
  const PALETTE = ["#2f6fed", "#d9480f", "#2b8a3e", "#862e9c", "#c92a2a", "#0b7285", "#e67700", "#5c940d", "#364fc7"];

  // TensorBoard-style exponential smoothing with debiasing; gaps stay gaps (mirrors webapp/charts.py ema).
  function ema(values, weight) {
    let last = 0, n = 0;
    return values.map((v) => {
      if (v === null || v === undefined) return null;
      last = last * weight + (1 - weight) * v;
      n += 1;
      return weight > 0 ? last / (1 - Math.pow(weight, n)) : v;
    });
  }

  function panelWidth(el) { return Math.max(280, el.clientWidth - 8); }

  function makePlot(container, id, title, xLabel, series, data, extra = {}) {
    const box = document.createElement("div");
    box.className = "chart";
    box.id = "chart-" + id;
    container.appendChild(box);
    const opts = {
      title, width: panelWidth(box), height: 220,
      scales: { x: { time: false } },
      axes: [{ label: xLabel }, {}],
      series: [{ label: xLabel }, ...series],
      ...extra,
    };
    return new uPlot(opts, data, box);
  }

  // ---- the run page -----------------------------------------------------------------------------
  function runPage({ data, socketPath }) {
    const container = document.getElementById("charts");
    const slider = document.getElementById("smoothing");
    const sliderValue = document.getElementById("smoothing-value");
    const liveState = document.getElementById("live-state");
    const series = data.series;            // {train: {step, wall, values: {key: [...]}}, eval: {...}}
    let panels = data.panels;              // [{id, title, kind, keys}]
    const catalogue = data.catalogue;      // every panel and the keys it takes (webapp/charts.py PANELS)
    const patterns = catalogue.map((p) => (p.pattern ? new RegExp("^(?:" + p.pattern + ")$") : null));
    let cursor = data.cursor;              // newest metric row id the page holds
    const plots = {};
    const lastStep = { train: lastOf(series.train.step), eval: lastOf(series.eval.step) };

    function lastOf(a) { return a && a.length ? a[a.length - 1] : -1; }

    function panelData(panel) {
      const s = series[panel.kind];
      const w = parseFloat(slider.value);
      return [s.step, ...panel.keys.map((k) => (panel.kind === "train" ? ema(s.values[k], w) : s.values[k]))];
    }

    function build() {
      container.innerHTML = "";
      for (const key of Object.keys(plots)) delete plots[key];
      for (const panel of panels) {
        const lines = panel.keys.map((k, i) => ({ label: k, stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: true }));
        plots[panel.id] = makePlot(container, panel.id, panel.title, "step", lines, panelData(panel));
      }
    }

    function redraw() { for (const panel of panels) plots[panel.id].setData(panelData(panel)); }

    function panelFor(kind, key) {
      return panels.find((p) => p.kind === kind && p.keys.includes(key));
    }

    function append(event) {
      if (event.id !== undefined && event.id <= cursor) return;   // already on the page (catch-up overlap)
      const kind = event.metric_kind || "train";
      if (event.step <= lastStep[kind]) { cursor = Math.max(cursor, event.id || cursor); return; }
      const s = series[kind];
      let rebuild = false;
      for (const key of Object.keys(event.values)) {
        if (typeof event.values[key] !== "number") continue;
        if (!s.values[key]) { s.values[key] = s.step.map(() => null); rebuild = true; }
      }
      s.step.push(event.step);
      s.wall.push(event.wall_time);
      for (const key of Object.keys(s.values)) {
        const v = event.values[key];
        s.values[key].push(typeof v === "number" ? v : null);
      }
      lastStep[kind] = event.step;
      if (event.id !== undefined) cursor = Math.max(cursor, event.id);
      if (kind === "train") { const el = document.getElementById("run-step"); if (el) el.textContent = event.step; }
      if (rebuild || Object.keys(event.values).some((k) => typeof event.values[k] === "number" && !panelFor(kind, k))) {
        regroup();
        build();
      } else {
        redraw();
      }
      const empty = document.getElementById("no-metrics");
      if (empty) empty.remove();
    }

    function regroup() {
      const out = [];
      for (const kind of ["train", "eval"]) {
        for (const key of Object.keys(series[kind].values).sort()) {
          const i = catalogue.findIndex((p, j) => p.kind === kind && (patterns[j] === null || patterns[j].test(key)));
          let panel = out.find((p) => p.id === catalogue[i].id);
          if (!panel) { panel = { id: catalogue[i].id, title: catalogue[i].title, kind, order: i, keys: [] }; out.push(panel); }
          panel.keys.push(key);
        }
      }
      panels = out.sort((a, b) => a.order - b.order);
    }

    function connect(delay) {
      const scheme = location.protocol === "https:" ? "wss://" : "ws://";
      const socket = new WebSocket(scheme + location.host + socketPath + "?since=" + cursor);
      socket.onopen = () => { liveState.textContent = "live"; liveState.className = "live"; delay = 1000; };
      socket.onmessage = (message) => {
        const event = JSON.parse(message.data);
        if (event.kind === "metrics") append(event);
        else if (event.kind === "status") document.body.dispatchEvent(new Event("run-status"));
        else if (event.kind === "trace") document.body.dispatchEvent(new Event("run-trace"));
        if (event.kind === "metrics" && event.step !== undefined) document.body.dispatchEvent(new Event("run-trace"));
        if (event.kind === "metrics" && event.metric_kind === "eval") document.body.dispatchEvent(new Event("run-eval"));
      };
      socket.onclose = () => {
        liveState.textContent = "reconnecting…"; liveState.className = "muted";
        setTimeout(() => connect(Math.min(delay * 2, 15000)), delay);
      };
    }

    slider.addEventListener("input", () => { sliderValue.textContent = slider.value; redraw(); });
    window.addEventListener("resize", () => { for (const p of Object.values(plots)) p.setSize({ width: panelWidth(p.root.parentNode), height: 220 }); });
    build();
    connect(1000);
    window.studioRun = { series, get cursor() { return cursor; } };   // for tests and curious users
  }

  // ---- the compare page -------------------------------------------------------------------------
  function comparePage({ data, x, smooth }) {
    const container = document.getElementById("charts");
    const slider = document.getElementById("smoothing");
    const sliderValue = document.getElementById("smoothing-value");
    const grouped = data.groups.length > 0;
    const plots = [];

    function chartFor(metric) {
      const w = parseFloat(slider.value);
      const smoothed = (vals) => (metric.kind === "train" ? ema(vals, w) : vals);
      const lines = [], columns = [];
      if (grouped) {
        const bands = [];
        for (const g of data.groups) {
          const s = g.series[metric.kind][metric.key];
          if (!s) continue;
          const xs = x === "wall" ? s.wall : s.step;
          const base = lines.length + 1;
          lines.push({ label: g.label + " mean", stroke: g.colour, width: 2, spanGaps: true },
                     { label: g.label + " −σ", stroke: g.colour + "55", width: 0.5, spanGaps: true },
                     { label: g.label + " +σ", stroke: g.colour + "55", width: 0.5, spanGaps: true });
          columns.push([xs, smoothed(s.mean)], [xs, smoothed(s.lo)], [xs, smoothed(s.hi)]);
          bands.push({ series: [base + 2, base + 1], fill: g.colour + "22" });
        }
        return { lines, data: uPlot.join(columns), extra: { bands } };
      }
      for (const r of data.runs) {
        const s = r.series[metric.kind];
        if (!s.values[metric.key]) continue;
        lines.push({ label: r.name, stroke: r.colour, width: 1.5, spanGaps: true });
        columns.push([x === "wall" ? s.wall : s.step, smoothed(s.values[metric.key])]);
      }
      return { lines, data: uPlot.join(columns), extra: {} };
    }

    function build() {
      container.innerHTML = "";
      plots.length = 0;
      for (const metric of data.metrics) {
        const c = chartFor(metric);
        if (!c.lines.length) continue;
        const title = metric.kind === "eval" && !metric.key.startsWith("eval/") ? "eval " + metric.key : metric.key;
        plots.push(makePlot(container, metric.kind + "-" + metric.key.replace(/[^a-zA-Z0-9_-]/g, "_"), title,
                            x === "wall" ? "wall time (s)" : "step", c.lines, c.data, c.extra));
      }
    }

    slider.addEventListener("input", () => { sliderValue.textContent = slider.value; build(); });
    slider.value = smooth; sliderValue.textContent = smooth;
    build();
  }

  return { ema, runPage, comparePage };
})();
