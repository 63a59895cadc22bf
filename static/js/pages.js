/* Page start-up without inline scripts (the Content-Security-Policy allows scripts from files only):
   each page names its data and options in data- attributes of its #page-data element. */
"use strict";
// Forms that destroy or stop something ask first: <form data-confirm="question">.
document.addEventListener("submit", (event) => {
  const question = event.target.dataset && event.target.dataset.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
});

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
