/* Trajectory inspector: step through an episode's turns one at a time, or show them all. */
"use strict";
document.addEventListener("click", (e) => {
  const button = e.target.closest("[data-move]");
  if (!button) return;
  const episode = button.closest(".episode");
  const turns = [...episode.querySelectorAll(".turn")];
  if (!turns.length) return;
  if (button.dataset.move === "all") { turns.forEach((t) => { t.hidden = false; }); return; }
  let i = turns.findIndex((t) => !t.hidden);
  i = Math.min(turns.length - 1, Math.max(0, i + parseInt(button.dataset.move, 10)));
  turns.forEach((t, j) => { t.hidden = j !== i; });
  episode.querySelector(".turn-no").textContent = i + 1;
});
const highlighted = document.querySelector(".episode.highlight");
if (highlighted) highlighted.scrollIntoView({ block: "center" });
document.addEventListener("change", (e) => {
  if (e.target.matches("[data-submit-on-change]")) e.target.form.submit();
});
