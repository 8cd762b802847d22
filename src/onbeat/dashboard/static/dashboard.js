// onbeat dashboard: live refresh, the schedule preview, confirmations. No framework, no build.
"use strict";
(() => {
  const body = document.body;
  const base = body.dataset.base || "";
  const liveState = document.querySelector(".live-state");
  let editing = false;

  // Live refresh: fetch this page again and swap every [data-live] element by id. Paused while
  // the page is hidden or a form is being filled in.
  const every = Number(body.dataset.refresh || 0) * 1000;
  document.addEventListener("input", (event) => { if (event.target.closest("form")) editing = true; });
  async function refresh() {
    if (editing && liveState) liveState.textContent = "· paused while a form is being filled in";
    if (document.hidden || editing) return;
    try {
      const response = await fetch(location.href, {
        headers: { "X-Onbeat-Refresh": "1" }, credentials: "same-origin", cache: "no-store",
      });
      if (response.redirected) { location.reload(); return; }  // the session ended
      if (!response.ok) throw new Error(String(response.status));
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      for (const element of fresh.querySelectorAll("[data-live][id]")) {
        const current = document.getElementById(element.id);
        if (current) current.replaceWith(document.importNode(element, true));
      }
      if (liveState) liveState.textContent = "· live";
    } catch (error) {
      if (liveState) liveState.textContent = "· not refreshing (" + error.message + "), retrying";
    }
  }
  if (every > 0) setInterval(refresh, every);

  // A form's schedule fields: show the ones its kind uses, and preview its next fire times.
  for (const form of document.querySelectorAll("form[data-preview]")) {
    const box = document.getElementById(form.dataset.preview);
    const kind = form.elements.namedItem("kind");
    let timer = null;
    const showFields = () => {
      for (const field of form.querySelectorAll("[data-kind]")) {
        field.hidden = !field.dataset.kind.split(" ").includes(kind.value);
      }
    };
    const preview = async () => {
      const query = new URLSearchParams();
      for (const name of ["kind", "expression", "at", "timezone"]) {
        const field = form.elements.namedItem(name);
        if (field) query.set(name, field.value);
      }
      if (kind.value === "now") { box.textContent = ""; return; }
      const response = await fetch(base + "/preview?" + query, { credentials: "same-origin" });
      if (response.ok && !response.redirected) box.innerHTML = await response.text();
    };
    form.addEventListener("input", () => {
      showFields();
      clearTimeout(timer);
      timer = setTimeout(preview, 250);
    });
    showFields();
    preview();
  }

  // Forms whose action cannot be undone ask first.
  document.addEventListener("submit", (event) => {
    const message = event.target.dataset.confirm;
    if (message && !window.confirm(message)) event.preventDefault();
  });
})();
