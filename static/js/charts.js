/* Dashboard charts: uPlot panels for a run (live over a WebSocket) and small multiples comparing runs.
   What goes where comes from the server (webapp/charts.py): the panel catalogue with its sections, the keys
   drawn first, how many series a panel draws at first, and how few points are never smoothed. */
"use strict";
const Studio = (() => {
  const PALETTE = ["#2f6fed", "#d9480f", "#2b8a3e", "#862e9c", "#c92a2a", "#0b7285", "#e67700", "#5c940d", "#364fc7"];
  const STEP_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000, 500000, 1000000];

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

  // What a curve draws: its own values at weight 0 or with fewer than minPoints points (charts.py smooth).
  function smooth(values, weight, minPoints) {
    const points = values.filter((v) => v !== null && v !== undefined).length;
    return weight <= 0 || points < minPoints ? values.slice() : ema(values, weight);
  }

  function fmt(v) {
    if (v === null || v === undefined) return "–";
    return Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(4)));
  }

  // [first, last] of the steps given (the run's own range; one step gets a unit either side, not 0-100).
  function stepRange(stepLists) {
    let lo = Infinity, hi = -Infinity;
    for (const steps of stepLists) for (const s of steps || []) { if (s < lo) lo = s; if (s > hi) hi = s; }
    if (lo === Infinity) return [0, 1];
    return lo === hi ? [Math.max(0, lo - 1), hi + 1] : [lo, hi];
  }

  function chartWidth(el) { return Math.max(240, el.clientWidth - 8); }

  // A curve of this few points draws each as a dot: one point makes no line at all, two a bare segment.
  const SPARSE_POINTS = 12;
  function sparse(u, si) {
    let n = 0;
    for (const v of u.data[si] || []) if (v !== null && v !== undefined) n += 1;
    return n <= SPARSE_POINTS;
  }

  // The y range: uPlot's padded one, and a flat curve (one point, or all equal) centred in a readable span.
  function yRange(u, min, max) {
    if (min === null || max === null) return [0, 1];
    if (min === max) {  // a rate or a count never goes below 0 on its axis
      const pad = Math.abs(min) > 1 ? Math.abs(min) * 0.1 : 0.5;
      return [min >= 0 ? Math.max(0, min - pad) : min - pad, max + pad];
    }
    return uPlot.rangeNum(min, max, 0.1, true);
  }

  /* One uPlot chart in a new box under ``parent``. ``lines``: uPlot series (without x); ``raw``: the values
     the hover legend shows (aligned with ``data``); ``range``: a function giving the x range, or null. */
  function makePlot(parent, { id, title, xLabel, lines, data, raw, range, height, extra = {} }) {
    const box = document.createElement("div");
    box.className = "chart";
    box.id = "chart-" + id;
    parent.appendChild(box);
    const series = lines.map((line) => ({
      spanGaps: true,
      points: line.inLegend === false ? { show: false } : { show: sparse, size: 7, fill: line.stroke },
      ...line,
      value: (u, v, si, idx) => fmt(u.raw && u.raw[si] ? u.raw[si][idx] : v),   // live pages replace u.raw
    }));
    const xAxis = range ? { label: xLabel, incrs: STEP_INCRS, values: (u, ticks) => ticks.map(String) } : { label: xLabel };
    const opts = {
      title, width: chartWidth(box), height,
      scales: { x: range ? { time: false, range: () => range() } : { time: false }, y: { range: yRange } },
      axes: [xAxis, {}],
      series: [{ label: xLabel, value: (u, v) => fmt(v) }, ...series],
      ...extra,
    };
    const plot = new uPlot(opts, data, box);
    plot.raw = raw;
    // series marked ``inLegend: false`` (the bounds of a band) are left out of the legend
    box.querySelectorAll(".u-legend .u-series").forEach((row, i) => {
      if (i > 0 && lines[i - 1].inLegend === false) row.hidden = true;
    });
    return plot;
  }

  function onResize(plots, height) {
    window.addEventListener("resize", () => {
      for (const p of Object.values(plots)) p.setSize({ width: chartWidth(p.root.parentNode), height });
    });
  }

  // ---- the run page -----------------------------------------------------------------------------
  function runPage({ data, socketPath }) {
    const HEIGHT = 220;
    const grid = document.getElementById("charts");
    const sectionsBox = document.getElementById("panel-sections");
    const filterBox = document.getElementById("panel-filter");
    const slider = document.getElementById("smoothing");
    const sliderValue = document.getElementById("smoothing-value");
    const liveState = document.getElementById("live-state");
    const series = data.series;            // {train: {step, wall, values: {key: [...]}}, eval: {...}}
    let panels = data.panels;              // [{id, title, kind, section, keys}]
    const catalogue = data.catalogue;      // every panel, its pattern and section (webapp/charts.py PANELS)
    const leading = data.leading;          // keys drawn first, in order (charts.LEADING_KEYS)
    const patterns = catalogue.map((p) => (p.pattern ? new RegExp("^(?:" + p.pattern + ")$") : null));
    let cursor = data.cursor;              // newest metric row id the page holds
    const plots = {};
    const userOpen = new Set();            // sections the person opened (the filter opens others for a while)
    const lastStep = { train: lastOf(series.train.step), eval: lastOf(series.eval.step) };

    function lastOf(a) { return a && a.length ? a[a.length - 1] : -1; }
    const range = () => stepRange([series.train.step, series.eval.step]);

    // The header's "bank now" count (the same query as the bank page), drawn on the Bank size chart as one
    // point at the newest step: the curve is each step's size when its row was written, the point is now.
    const BANK_PANEL = "bank-size", BANK_NOW = "bank now (as in the header)";
    function bankNow() {
      const el = document.getElementById("run-bank-size");
      return el && el.dataset.bankNow !== undefined ? Number(el.dataset.bankNow) : null;
    }
    function bankNowColumn(steps) {
      const now = bankNow();
      return steps.map((_, i) => (i === steps.length - 1 ? now : null));
    }

    function columns(panel, weight) {
      const s = series[panel.kind];
      const ys = panel.keys.map((k) => (panel.kind === "train" ? smooth(s.values[k], weight, data.smooth_min_points) : s.values[k].slice()));
      if (panel.id === BANK_PANEL && bankNow() !== null) ys.push(bankNowColumn(s.step));
      return [s.step.slice(), ...ys];
    }

    function draw(panel, parent) {
      const lines = panel.keys.map((k, i) => ({
        label: k, stroke: PALETTE[i % PALETTE.length], width: 1.5, show: i < data.max_series,
      }));
      if (panel.id === BANK_PANEL && bankNow() !== null) {
        lines.push({ label: BANK_NOW, stroke: "#212529", width: 0, points: { show: true, size: 9, fill: "#ffffff" } });
      }
      plots[panel.id] = makePlot(parent, {
        id: panel.id, title: panel.title, xLabel: "step", lines, height: HEIGHT, range,
        data: columns(panel, parseFloat(slider.value)), raw: columns(panel, 0),
      });
      plots[panel.id].root.parentNode.dataset.search = (panel.title + " " + panel.keys.join(" ")).toLowerCase();
    }

    function sectionOf(panel) { return panel.section || ""; }

    function build() {
      grid.innerHTML = "";
      sectionsBox.innerHTML = "";
      for (const key of Object.keys(plots)) delete plots[key];
      for (const panel of panels.filter((p) => !sectionOf(p))) draw(panel, grid);
      const names = [...new Set(panels.map(sectionOf).filter(Boolean))];
      for (const name of names) {
        const members = panels.filter((p) => sectionOf(p) === name);
        const details = document.createElement("details");
        details.className = "panel-section";
        details.dataset.section = name;
        const summary = document.createElement("summary");
        summary.textContent = name + " ";
        const count = document.createElement("span");
        count.className = "muted";
        count.textContent = "(" + members.map((p) => p.title).join(" · ") + ")";
        summary.appendChild(count);
        const body = document.createElement("div");
        body.className = "charts";
        details.append(summary, body);
        sectionsBox.appendChild(details);
        details.addEventListener("toggle", () => {
          if (details.open && !body.childElementCount) for (const p of members) draw(p, body);
          if (!filterBox.value.trim()) { if (details.open) userOpen.add(name); else userOpen.delete(name); }
          applyFilter();
        });
        if (userOpen.has(name)) details.open = true;  // drawn by the toggle handler
      }
      applyFilter();
    }

    // Panels whose title or metric names contain the filter text; sections with a match open, others hide.
    function applyFilter() {
      const q = filterBox.value.trim().toLowerCase();
      const matches = (p) => !q || (p.title + " " + p.keys.join(" ")).toLowerCase().includes(q);
      for (const details of sectionsBox.querySelectorAll("details")) {
        const any = panels.some((p) => sectionOf(p) === details.dataset.section && matches(p));
        details.hidden = !any;
        const wanted = q ? any : userOpen.has(details.dataset.section);
        if (details.open !== wanted) details.open = wanted;
      }
      for (const box of document.querySelectorAll("#charts .chart, #panel-sections .chart")) {
        box.hidden = Boolean(q) && !box.dataset.search.includes(q);
      }
      const shown = panels.filter(matches).length;
      document.getElementById("panel-count").textContent = q ? shown + " of " + panels.length + " panels" : panels.length + " panels";
    }

    function redraw() {
      const w = parseFloat(slider.value);
      for (const panel of panels) {
        const plot = plots[panel.id];
        if (!plot) continue;
        plot.raw = columns(panel, 0);
        plot.setData(columns(panel, w));
      }
    }

    function panelFor(kind, key) { return panels.find((p) => p.kind === kind && p.keys.includes(key)); }

    function keyOrder(a, b) {
      const rank = (k) => (leading.includes(k) ? leading.indexOf(k) : leading.length);
      const depth = (k) => k.split("/").length;
      return rank(a) - rank(b) || depth(a) - depth(b) || (a < b ? -1 : a > b ? 1 : 0);
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
        for (const key of Object.keys(series[kind].values)) {
          const i = catalogue.findIndex((p, j) => p.kind === kind && (patterns[j] === null || patterns[j].test(key)));
          let panel = out.find((p) => p.id === catalogue[i].id);
          if (!panel) { panel = { id: catalogue[i].id, title: catalogue[i].title, kind, section: catalogue[i].section, order: i, keys: [] }; out.push(panel); }
          panel.keys.push(key);
        }
      }
      for (const panel of out) panel.keys.sort(keyOrder);
      panels = out.sort((a, b) => a.order - b.order);
    }

    // Close codes after which reconnecting cannot help (webapp/consumers.py): say why, and stay closed.
    const FINAL_CLOSES = {
      4429: "too many live pages open — close some tabs, then reload this page",
      4403: "live updates stopped: you may no longer watch this run (reload the page)",
    };

    // "phase · n of N unit · elapsed · about T left", as the header renders it (run_pages.progress_line)
    function duration(seconds) {
      seconds = Math.round(seconds || 0);
      if (seconds < 60) return seconds + "s";
      const m = Math.floor(seconds / 60), s = String(seconds % 60).padStart(2, "0");
      if (m < 60) return m + "m " + s + "s";
      return Math.floor(m / 60) + "h " + String(m % 60).padStart(2, "0") + "m";
    }
    // The last progress of each line and when it arrived: the clock ticks on between reports.
    const progressLines = {};
    function showProgress(p) {
      const id = p.track === "extractor" ? "run-extractor-progress" : "run-progress";
      const el = document.getElementById(id);
      if (!el || !p.phase) return;
      progressLines[id] = { p, at: Date.now(), el };
      renderProgress(id);
    }
    function renderProgress(id) {
      const el = document.getElementById(id), line = progressLines[id];
      if (!el || !line) return;
      const p = line.p, since = (Date.now() - line.at) / 1000;
      const parts = [p.phase];
      if (p.total) parts.push((p.done + " of " + p.total + " " + (p.unit || "")).trim());
      else if (p.done) parts.push((p.done + " " + (p.unit || "")).trim());
      if (p.turns) parts.push("turn " + (p.turn || 0) + " of " + p.turns);
      parts.push(duration((p.elapsed_s || 0) + since));
      if (p.eta_s !== null && p.eta_s !== undefined && p.done < p.total) {
        parts.push((p.turns ? "at most " : "about ") + duration(Math.max(0, p.eta_s - since)) + " left");
      }
      el.textContent = parts.join(" · ");
      el.hidden = false;
    }
    function tickProgress() {
      for (const id of ["run-progress", "run-extractor-progress"]) {
        const el = document.getElementById(id);
        if (!el || el.hidden) continue;
        const line = progressLines[id];
        // the header was re-rendered by the server (htmx) since: start again from what it rendered
        if (el.dataset.progress && (!line || line.el !== el)) {
          const p = JSON.parse(el.dataset.progress);
          if (!p.phase) continue;
          progressLines[id] = { p, at: Date.now(), el };
        }
        renderProgress(id);
      }
    }
    setInterval(tickProgress, 1000);

    function connect(delay) {
      const scheme = location.protocol === "https:" ? "wss://" : "ws://";
      const socket = new WebSocket(scheme + location.host + socketPath + "?since=" + cursor);
      socket.onopen = () => { liveState.textContent = "live"; liveState.className = "live"; delay = 1000; };
      socket.onmessage = (message) => {
        const event = JSON.parse(message.data);
        if (event.kind === "metrics") append(event);
        else if (event.kind === "status") document.body.dispatchEvent(new Event("run-status"));
        else if (event.kind === "trace") document.body.dispatchEvent(new Event("run-trace"));
        else if (event.kind === "progress") showProgress(event);
        if (event.kind === "metrics" && event.step !== undefined) document.body.dispatchEvent(new Event("run-trace"));
        if (event.kind === "metrics" && event.metric_kind === "train") document.body.dispatchEvent(new Event("run-step"));
        if (event.kind === "metrics" && event.metric_kind === "eval") document.body.dispatchEvent(new Event("run-eval"));
      };
      socket.onclose = (close) => {
        if (FINAL_CLOSES[close.code]) { liveState.textContent = FINAL_CLOSES[close.code]; liveState.className = "error"; return; }
        liveState.textContent = "reconnecting…"; liveState.className = "muted";
        setTimeout(() => connect(Math.min(delay * 2, 15000)), delay);
      };
    }

    slider.addEventListener("input", () => { sliderValue.textContent = slider.value; redraw(); });
    filterBox.addEventListener("input", applyFilter);
    // the header is re-rendered by the server (htmx): its bank count moves the chart's "bank now" point
    document.body.addEventListener("htmx:afterSwap", () => {
      const plot = plots[BANK_PANEL], panel = panels.find((p) => p.id === BANK_PANEL);
      if (!plot || !panel) return;
      const drawn = plot.series.length - 1 > panel.keys.length;   // uPlot's series 0 is the x axis
      if (drawn !== (bankNow() !== null)) { build(); return; }
      plot.raw = columns(panel, 0);
      plot.setData(columns(panel, parseFloat(slider.value)));
    });
    onResize(plots, HEIGHT);
    build();
    connect(1000);
    window.studioRun = { series, plots, get cursor() { return cursor; } };   // for tests and curious users
  }

  // ---- the compare page: one small chart per picked metric, runs (or seed groups) as lines -------
  const DASHES = [[], [8, 4], [2, 3], [12, 4, 2, 4], [4, 4], [1, 5]];
  function sameSeries(a, b) { return a.length === b.length && a.every((v, i) => v === b[i]); }

  function comparePage({ data, x }) {
    const HEIGHT = 170;
    const grid = document.getElementById("charts");
    const slider = document.getElementById("smoothing");
    const sliderValue = document.getElementById("smoothing-value");
    const picker = document.getElementById("metric-picker");
    const pickerFilter = document.getElementById("metric-filter");
    const grouped = data.groups.length > 0;
    const plots = {};
    const wall = x === "wall";
    const allSteps = data.runs.flatMap((r) => [r.series.train.step, r.series.eval.step]);
    const range = wall ? null : () => stepRange(allSteps);

    function chartFor(metric, weight) {
      const sm = (vals) => (metric.kind === "train" ? smooth(vals, weight, data.smooth_min_points) : vals.slice());
      const lines = [], shown = [], raw = [], bands = [];
      if (grouped) {
        for (const g of data.groups) {
          const s = g.series[metric.kind][metric.key];
          if (!s) continue;
          const xs = wall ? s.wall : s.step;
          const base = lines.length + 1;
          lines.push({ label: g.label + " mean", stroke: g.colour, width: 2 },
                     { label: g.label + " 95% low", stroke: g.colour + "55", width: 0.5, spanGaps: false, inLegend: false },
                     { label: g.label + " 95% high", stroke: g.colour + "55", width: 0.5, spanGaps: false, inLegend: false });
          shown.push([xs, sm(s.mean)], [xs, sm(s.lo)], [xs, sm(s.hi)]);
          raw.push([xs, s.mean], [xs, s.lo], [xs, s.hi]);
          bands.push({ series: [base + 2, base + 1], fill: g.colour + "22" });
        }
      } else {
        const drawn = [];   // [name, xs, ys] of the runs drawn so far: an identical series says whose it repeats
        for (const r of data.runs) {
          const s = r.series[metric.kind];
          if (!s.values[metric.key]) continue;
          const xs = wall ? s.wall : s.step, ys = s.values[metric.key];
          const twin = drawn.find(([, xs2, ys2]) => sameSeries(xs, xs2) && sameSeries(ys, ys2));
          const label = twin ? r.name + " (identical to " + twin[0] + ")" : r.name;
          // each run its own dash, so lines that coincide still show every run
          lines.push({ label, stroke: r.colour, width: 1.5, dash: DASHES[lines.length % DASHES.length] });
          shown.push([xs, sm(ys)]);
          raw.push([xs, ys]);
          drawn.push([r.name, xs, ys]);
        }
      }
      return { lines, data: uPlot.join(shown), raw: uPlot.join(raw), extra: bands.length ? { bands } : {} };
    }

    function selected() {
      return [...picker.querySelectorAll("input[name=metric]:checked")].map((box) => {
        const i = box.value.indexOf(":");
        return { kind: box.value.slice(0, i), key: box.value.slice(i + 1) };
      });
    }

    function build() {
      grid.innerHTML = "";
      for (const key of Object.keys(plots)) delete plots[key];
      const weight = parseFloat(slider.value);
      for (const metric of selected()) {
        const c = chartFor(metric, weight);
        if (!c.lines.length) continue;
        const title = metric.kind === "eval" && !metric.key.startsWith("eval/") ? "eval " + metric.key : metric.key;
        const id = metric.kind + "-" + metric.key.replace(/[^a-zA-Z0-9_-]/g, "_");
        plots[id] = makePlot(grid, { id, title, xLabel: wall ? "wall time (s)" : "step", lines: c.lines,
                                     data: c.data, raw: c.raw, range, height: HEIGHT, extra: c.extra });
      }
      document.getElementById("picked-count").textContent = selected().length;
    }

    // The URL keeps the picked metrics, so the page can be shared as it is seen.
    function remember() {
      const params = new URLSearchParams(location.search);
      params.delete("metric");
      for (const m of selected()) params.append("metric", m.kind + ":" + m.key);
      history.replaceState(null, "", location.pathname + "?" + params.toString());
      const csv = document.getElementById("csv-link");  // the CSV holds what the page shows
      if (csv) csv.href = csv.pathname + "?" + params.toString();
    }

    picker.addEventListener("change", (event) => {
      if (event.target.name !== "metric") return;
      build();
      remember();
    });
    pickerFilter.addEventListener("input", () => {
      const q = pickerFilter.value.trim().toLowerCase();
      for (const label of picker.querySelectorAll("label.metric")) {
        label.hidden = Boolean(q) && !label.dataset.search.includes(q);
      }
      for (const group of picker.querySelectorAll("fieldset")) {
        group.hidden = !group.querySelector("label.metric:not([hidden])");
      }
    });
    slider.addEventListener("input", () => { sliderValue.textContent = slider.value; build(); });
    onResize(plots, HEIGHT);
    build();
    window.studioCompare = { plots };
  }

  return { ema, smooth, runPage, comparePage };
})();
