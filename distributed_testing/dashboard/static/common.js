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
// itself and sends Last-Event-ID, so a dropped connection loses nothing. With `everyMs`, also
// that often (what changes without an event: a group member's health); with `accept(kind, data)`,
// only after the events it accepts (a run's page: its own tasks').
export function live(kinds, refresh, everyMs, accept) {
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
  const wanted = (k, e) => { try { return accept(k, JSON.parse(e.data)); } catch { return true; } };
  for (const k of kinds) feed.addEventListener(k, e => { if (!accept || wanted(k, e)) schedule(); });
  feed.addEventListener("reset", schedule);
  window.dtFeed = feed;
  if (everyMs) setInterval(schedule, everyMs);
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
    el("tbody", {}, rows.length ? rows.map(r => el("tr", { "data-id": r.task_id ?? r.worker_id ?? r.run_id ?? null },
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
export const canRerun = app.dataset.canRerun === "1";
export const taskLink = id => el("a", { href: `tasks/${encodeURIComponent(id)}` }, id);
export const seconds = s => s == null ? "—" : s < 60 ? `${num(s, 1)} s` : s < 3600 ? `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`
  : `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;

// The line of an error a person reads first: its first non-empty line. A Python traceback
// ("Traceback (most recent call last):" ...) is named by its last unindented line, the exception;
// a first line that ends in ":" (pytest's "exit code 2 (...):" before its output) gets the cause
// after it: pytest's first "E   ..." line, else the last line naming an exception. The whole text
// stays on the task page.
const EXC = /^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*/;
export function errorLine(text) {
  const lines = String(text ?? "").split("\n").map(l => l.trimEnd()).filter(l => l.trim());
  if (!lines.length) return "";
  const [first, ...rest] = lines;
  if (first.startsWith("Traceback (most recent call last)")) {
    const last = rest.filter(l => !/^\s/.test(l)).pop();
    return last ?? first;
  }
  if (first.endsWith(":") && rest.length) {
    const cause = rest.find(l => /^E\s+\S/.test(l))?.replace(/^E\s+/, "") ?? rest.filter(l => EXC.test(l)).pop();
    if (cause) return `${first} ${cause}`;
  }
  return first;
}

// A table cell for an error: its first line (errorLine), and when there is more, a link to the
// task page that shows all of it.
export function errorCell(text, taskId) {
  const line = errorLine(text);
  if (!line) return "";
  const more = String(text).trim() !== line && taskId != null;
  return el("span", { class: "err-line" }, line, more ? " " : null,
    more ? el("a", { class: "more", href: `tasks/${encodeURIComponent(taskId)}` }, "(full error)") : null);
}

// A run's counts by task state ({succeeded: 3, failed: 1}) as "3 succeeded 1 failed", coloured;
// how long a run has taken (so far, while it runs).
export const counts = c => el("span", { class: "counts" }, Object.entries(c ?? {}).map(([k, n]) => el("span", { class: "count" }, `${n} `, state(k))));
export const took = r => r.started_at == null ? null : (r.ended_at ?? Date.now() / 1000) - r.started_at;

// Pytest's words for a test's outcome, coloured as the task states are.
export const outcome = o => el("span", { class: `outcome-${o}` }, o);

// A linear time axis (x in ms since the epoch) that spans the data, padded: a minute either side of
// a single time, 5 % of the span otherwise; ticks as times of day (with seconds within an hour),
// dates beyond a day.
export function timeAxis(times) {
  const xs = times.filter(Number.isFinite);
  if (!xs.length) return { type: "linear" };
  const lo = Math.min(...xs), hi = Math.max(...xs), pad = hi > lo ? (hi - lo) * 0.05 : 60_000;
  const span = hi - lo + 2 * pad, hm = { hour: "2-digit", minute: "2-digit" };
  const label = span <= 3_600_000 ? v => new Date(v).toLocaleTimeString([], { ...hm, second: "2-digit" })
    : span <= 86_400_000 ? v => new Date(v).toLocaleTimeString([], hm)
      : v => new Date(v).toLocaleString([], { month: "short", day: "numeric", ...hm });
  return { type: "linear", min: lo - pad, max: hi + pad, ticks: { maxTicksLimit: 8, callback: label } };
}

// A count or rate axis: starts at 0 and, with nothing to show, still spans 0..1 (not -1..1).
export const countAxis = (title, integer = false) => ({ min: 0, suggestedMax: 1, title: { display: !!title, text: title },
  ticks: integer ? { precision: 0 } : {} });
export const canDrain = app.dataset.canDrain === "1";

// One Chart.js chart in a box with id; updated in place (no flicker) on later calls.
const charts = new Map();
export function chart(id, title, config, parent = app) {
  let c = charts.get(id);
  if (c) {  // the data, the title and the axes (a time axis follows its data) change; the chart stays
    c.data = config.data;
    c.options.plugins.title.text = title;
    if (config.options?.scales) c.options.scales = config.options.scales;
    c.update("none");
    return c;
  }
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
