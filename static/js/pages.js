/* Page start-up without inline scripts (the Content-Security-Policy allows scripts from files only):
   each page names its data and options in data- attributes of its #page-data element. */
"use strict";
// Forms that destroy or stop something ask first: <form data-confirm="question">.
document.addEventListener("submit", (event) => {
  const question = event.target.dataset && event.target.dataset.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
});

// Forms whose work takes a while say so at once: <form data-busy="Deleting 800 entries…"> disables its
// button and shows the words until the next page arrives (a second press cannot send it twice).
document.addEventListener("submit", (event) => {
  const form = event.target, words = form.dataset && form.dataset.busy;
  if (!words || event.defaultPrevented) return;
  const button = form.querySelector("button[type=submit]");
  if (button) { button.disabled = true; button.textContent = words; }
  form.setAttribute("aria-busy", "true");
});

// The launch form says how many runs its button starts, and a grid (an experiment name set, as a grid
// template does) asks before it launches: "methods × seeds = N runs of S steps", never a surprise.
function launchCount(form) {
  const checked = (name) => form.querySelectorAll(`input[name="${name}"]:checked`).length;
  const value = (id) => (form.querySelector("#" + id) || {}).value || "";
  const steps = value("id_steps");
  if (value("id_experiment").trim()) {
    const methods = checked("experiment_methods"), seeds = seedCount(value("id_experiment_seeds"));
    return { runs: methods * seeds, steps, grid: `${methods} method${methods === 1 ? "" : "s"} × ${seeds} seed${seeds === 1 ? "" : "s"}` };
  }
  return { runs: Math.max(1, parseInt(value("id_n_seeds"), 10) || 1), steps, grid: "" };
}
// "0-4, 7" -> 6 seeds, as the form's SeedListField reads it (a part it cannot read counts none)
function seedCount(text) {
  const seeds = new Set();
  for (const part of text.split(/[,\s]+/).filter(Boolean)) {
    const m = /^(\d{1,10})(?:-(\d{1,10}))?$/.exec(part);
    if (!m) continue;
    const low = Number(m[1]), high = Number(m[2] || m[1]);
    for (let s = low; s <= high && high - low < 16; s++) seeds.add(s);
  }
  return seeds.size;
}
function labelLaunch(form) {
  const button = form.querySelector("button[type=submit]");
  if (!button) return;
  const { runs, grid } = launchCount(form);
  button.textContent = grid ? `Launch experiment: ${runs} run${runs === 1 ? "" : "s"}` : runs > 1 ? `Launch ${runs} runs` : "Launch";
}
document.addEventListener("submit", (event) => {
  const form = event.target;
  if (form.id !== "launch-form" || event.defaultPrevented) return;
  const { runs, steps, grid } = launchCount(form);
  const name = (form.querySelector("#id_experiment") || {}).value || "";
  if (grid && !window.confirm(`This launches the experiment "${name.trim()}": ${grid} = ${runs} runs of ${steps} steps each, not one run. Launch them?`)) event.preventDefault();
});
for (const type of ["input", "change"]) {
  document.addEventListener(type, (event) => {
    const form = event.target.closest && event.target.closest("#launch-form");
    if (form) labelLaunch(form);
  });
}
// the form is first drawn, and redrawn by htmx when a template or preset is picked
document.addEventListener("DOMContentLoaded", () => { const f = document.getElementById("launch-form"); if (f) labelLaunch(f); });
document.addEventListener("htmx:afterSettle", () => { const f = document.getElementById("launch-form"); if (f) labelLaunch(f); });

document.addEventListener("DOMContentLoaded", () => {
  const page = document.getElementById("page-data");
  if (!page) return;
  const data = JSON.parse(document.getElementById(page.dataset.json).textContent);
  if (page.dataset.page === "run") {
    Studio.runPage({ data, socketPath: page.dataset.socketPath });
  } else if (page.dataset.page === "compare") {
    Studio.comparePage({ data, x: page.dataset.x });
  }
});
