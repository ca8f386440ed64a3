// jobsup web: the one script of the pages. It keeps a page live (polls live.json, which the server
// answers from its shared board, and reads the page's <main> again when needed) and asks before a
// button with data-confirm acts. No inline script anywhere: the Content-Security-Policy forbids it.
"use strict";

(function () {
  const POLL_MS = 1000;
  const main = document.getElementById("main");
  if (!main) return;

  // The notice after an action is shown once: a reload does not show it again.
  const url = new URL(window.location.href);
  if (url.searchParams.has("notice")) {
    const notice = url.searchParams.get("notice");
    url.searchParams.delete("notice");
    window.history.replaceState(null, "", url.pathname + url.search);
    const p = document.createElement("p");
    p.className = "notice";
    p.id = "notice";
    p.textContent = notice; // as text, never as HTML
    main.prepend(p);
  }

  document.addEventListener("click", function (event) {
    const button = event.target.closest("button[data-confirm]");
    if (button && !window.confirm(button.getAttribute("data-confirm"))) event.preventDefault();
  });

  function showBanner(text) {
    const banner = document.getElementById("banner");
    if (!banner) return;
    banner.textContent = text || "";
    banner.hidden = !text;
  }

  // A form being filled in is not wiped by the next refresh: the page waits until it is sent or cleared.
  function editing() {
    const active = document.activeElement;
    if (active && main.contains(active) && (active.tagName === "INPUT" || active.tagName === "SELECT")) return true;
    return Array.from(main.querySelectorAll("input:not([type=hidden])")).some((i) => i.value !== i.defaultValue);
  }

  async function reload() {
    const answer = await fetch(window.location.href, {
      headers: { "X-Jobsup-Fragment": "1" },
      credentials: "same-origin",
    });
    if (answer.status === 401) { window.location.reload(); return; }
    const html = await answer.text();
    if (editing()) return;
    const notice = document.getElementById("notice");
    main.innerHTML = html; // the server's own HTML, every value in it escaped
    if (notice) main.prepend(notice);
  }

  async function poll() {
    const mode = main.getAttribute("data-live");
    if (mode === "off") return;
    try {
      const answer = await fetch(main.getAttribute("data-poll"), { credentials: "same-origin" });
      if (answer.status === 401) { window.location.reload(); return; }
      const state = await answer.json();
      if (state.error) { showBanner(state.error); return; }
      showBanner("");
      if (mode === "always" || state.version !== main.getAttribute("data-version")) {
        main.setAttribute("data-version", state.version);
        await reload();
      }
    } catch (error) {
      showBanner("The web console cannot be reached: " + error);
    } finally {
      window.setTimeout(poll, POLL_MS);
    }
  }

  window.setTimeout(poll, POLL_MS);
})();
