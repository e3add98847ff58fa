// Shared by every page: JSON reads, actions with the CSRF token, the live event feed, small
// DOM and chart helpers. No credential ever passes through here: the session cookie is HttpOnly.
export const app = document.getElementById("app");
const csrf = document.querySelector('meta[name="csrf-token"]')?.content ?? "";

export async function getJSON(path, params) {
  const q = params ? "?" + new URLSearchParams(Object.entries(params).filter(([, v]) => v !== "" && v != null)) : "";
  const r = await fetch(path + q, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (r.status === 401) { location.href = "login"; throw new Error("signed out"); }
  const body = await r.json();
  if (!r.ok) throw new Error(`${r.status}: ${body.message ?? JSON.stringify(body)}`);
  return body;
}

export async function act(path, body) {
  const r = await fetch(path, { method: "POST", credentials: "same-origin",
    headers: { "X-CSRF-Token": csrf, "Content-Type": "application/json" }, body: JSON.stringify(body ?? {}) });
  const answer = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(`${r.status}: ${answer.message ?? r.statusText}`);
  return answer;
}

// Calls refresh() once now and again (at most every 300 ms) after each event whose kind is in
// `kinds`; a "reset" (the feed could not be resumed) always refreshes. EventSource reconnects by
// itself and sends Last-Event-ID, so a dropped connection loses nothing.
export function live(kinds, refresh) {
  let timer = null, running = false, again = false;
  const run = async () => {
    if (running) { again = true; return; }
    running = true;
    try { await refresh(); } catch (e) { showError(e); } finally { running = false; }
    if (again) { again = false; schedule(); }
  };
  const schedule = () => { if (!timer) timer = setTimeout(() => { timer = null; run(); }, 300); };
  const feed = new EventSource("events");
  const dot = document.getElementById("live");
  feed.onopen = () => dot?.classList.add("on");
  feed.onerror = () => dot?.classList.remove("on");
  for (const k of [...kinds, "reset"]) feed.addEventListener(k, schedule);
  window.dtFeed = feed;
  run();
  return feed;
}

export function showError(e) {
  let box = document.getElementById("error");
  if (!box) { box = el("p", { id: "error", class: "error", role: "alert" }); app.prepend(box); }
  box.textContent = String(e.message ?? e);
}

export function el(tag, attrs = {}, ...children) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null || v === false) continue;
    if (k.startsWith("on")) n.addEventListener(k.slice(2), v); else n.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c != null) n.append(c instanceof Node ? c : String(c));
  return n;
}

// A table of `rows`; `cols` = [[header, row => cell, "num"?], ...]; replaces the element with id.
export function table(id, cols, rows, empty = "nothing here") {
  const t = el("table", { id },
    el("thead", {}, el("tr", {}, cols.map(([h, , cls]) => el("th", { class: cls }, h)))),
    el("tbody", {}, rows.length ? rows.map(r => el("tr", { "data-id": r.task_id ?? r.worker_id ?? null },
      cols.map(([, f, cls]) => el("td", { class: cls }, f(r))))) : el("tr", {}, el("td", { colspan: cols.length, class: "muted" }, empty))));
  place(id, t);
  return t;
}

export function place(id, node) {
  const old = document.getElementById(id);
  if (old) old.replaceWith(node); else app.append(node);
  node.id = id;
  return node;
}

export function section(id, title) {
  let s = document.getElementById(id);
  if (!s) { s = el("section", { id }, el("h2", {}, title)); app.append(s); }
  return s;
}

export const state = s => el("span", { class: `state-${s}` }, s);
export const when = t => t ? new Date(t * 1000).toLocaleString() : "—";
export const ago = t => t ? `${Math.max(0, Math.round(Date.now() / 1000 - t))} s ago` : "—";
export const num = (v, d = 2) => v == null ? "—" : Number(v).toLocaleString(undefined, { maximumFractionDigits: d });
export const canCancel = app.dataset.canCancel === "1";
export const canDrain = app.dataset.canDrain === "1";

// One Chart.js chart in a box with id; updated in place (no flicker) on later calls.
const charts = new Map();
export function chart(id, title, config, parent = app) {
  let c = charts.get(id);
  if (c) { c.data = config.data; c.update("none"); return c; }
  const box = el("div", { class: "chart", id: `${id}-box` }, el("canvas", { id, "aria-label": title, role: "img" }));
  parent.append(box);
  config.options = { animation: false, maintainAspectRatio: false, responsive: true,
    plugins: { title: { display: true, text: title } }, ...config.options };
  c = new window.Chart(document.getElementById(id), config);
  charts.set(id, c);
  window.dtCharts = Object.fromEntries(charts);
  return c;
}

document.getElementById("signout")?.addEventListener("click", async () => {
  try { await act("logout"); } finally { location.href = "login"; }
});
