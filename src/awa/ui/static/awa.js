// awa operator UI: small enhancements; every page works without them. The pages carry no
// inline script or style (their Content-Security-Policy forbids it): behaviour lives here.
"use strict";

// Pages with a [data-refresh] block re-read themselves every few seconds.
function keepFresh(block) {
  const seconds = parseFloat(block.dataset.refresh) || 5;
  setInterval(async () => {
    if (document.hidden) return;
    try {
      const response = await fetch(location.href, { headers: { "Accept": "text/html" } });
      if (!response.ok) return;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.getElementById(block.id);
      if (fresh) block.innerHTML = fresh.innerHTML;
    } catch (error) { /* the next tick tries again */ }
  }, seconds * 1000);
}

// An unfinished job's page follows it: progress live, and a reload when its state changes.
function followJob(node) {
  const progress = document.getElementById("progress");
  const timer = setInterval(async () => {
    try {
      const response = await fetch(node.dataset.liveUrl);
      if (!response.ok) return;
      const live = await response.json();
      if (progress && live.progress !== null) progress.textContent = JSON.stringify(live.progress, null, 2);
      if (live.state !== node.dataset.state) { clearInterval(timer); location.reload(); }
    } catch (error) { /* the next tick tries again */ }
  }, 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-refresh]").forEach(keepFresh);
  document.querySelectorAll("[data-live-url]").forEach((node) => {
    if (!["completed", "failed", "cancelled"].includes(node.dataset.state)) followJob(node);
  });
  // A workflow's steps are indented by depth (set here: the policy allows no inline style).
  document.querySelectorAll("[data-depth]").forEach((item) => {
    item.style.marginLeft = `${(parseInt(item.dataset.depth, 10) || 0) * 1.5}rem`;
  });
  document.querySelectorAll("[data-select-all]").forEach((box) => {
    box.addEventListener("change", () => {
      box.closest("form").querySelectorAll("input[name=ids]").forEach((item) => { item.checked = box.checked; });
    });
  });
});
