// Tasks: filters (state, type, tag, submitter, time) and pages cut by the coordinator, pending
// tasks with why they wait, the first line of a failed task's error (the rest on its page), cancel
// for roles that may. The filter and page live in the URL.
import { app, getJSON, act, live, el, table, place, state, when, canCancel, showError, errorCell, taskLink } from "./common.js";

const PAGE = 50;
const params = new URLSearchParams(location.search);
const field = (name, label, input) => { input.name = name; input.value = params.get(name) ?? ""; return el("label", {}, label, input); };
const STATES = ["", "pending", "assigned", "running", "succeeded", "failed", "timed_out", "error", "cancelled"];
const form = el("form", { class: "filters", id: "filters" },
  field("state", "state", el("select", {}, STATES.map(s => el("option", { value: s }, s || "any")))),
  field("type", "type", el("select", {}, ["", "benchmark", "test", "custom"].map(s => el("option", { value: s }, s || "any")))),
  field("tag", "tag", el("input", { size: 10 })), field("submitted_by", "submitter key", el("input", { size: 10 })),
  field("since", "since", el("input", { type: "datetime-local" })), field("until", "until", el("input", { type: "datetime-local" })),
  el("button", { type: "submit" }, "Filter"));
app.append(form);
form.addEventListener("submit", e => { e.preventDefault(); const p = new URLSearchParams(new FormData(form)); p.delete("offset");
  for (const [k, v] of [...p]) if (!v) p.delete(k); history.replaceState(null, "", "tasks?" + p); params.forEach((_, k) => params.delete(k));
  p.forEach((v, k) => params.set(k, v)); refresh(); });

const epoch = v => v ? String(new Date(v).getTime() / 1000) : "";

async function cancel(t) {
  try { await act(`actions/tasks/${encodeURIComponent(t.task_id)}/cancel`); } catch (e) { showError(e); }
}

async function refresh() {
  const offset = Number(params.get("offset") ?? 0);
  const q = { state: params.get("state"), type: params.get("type"), tag: params.get("tag"), submitted_by: params.get("submitted_by"),
    since: epoch(params.get("since")), until: epoch(params.get("until")), limit: PAGE, offset };
  const { tasks, total } = await getJSON("data/tasks", q);
  const cols = [["task", t => taskLink(t.task_id)], ["type", t => t.type],
    ["state", t => state(t.state)], ["attempt", t => t.attempt, "num"], ["worker", t => t.worker_id ?? "—"],
    ["submitted", t => when(t.submitted_at)], ["by", t => t.submitted_by ?? "—"],
    ["run", t => t.run_id ? el("a", { href: `runs/${encodeURIComponent(t.run_id)}` }, t.run_id) : "—"],
    ["why waiting / error", t => t.pending_reason ?? errorCell(t.outcome?.error, t.task_id), "err"]];
  if (canCancel) cols.push(["", t => ["pending", "assigned", "running"].includes(t.state)
    ? el("button", { class: "act cancel", type: "button", onclick: () => cancel(t) }, "Cancel") : ""]);
  table("tasks", cols, tasks, "no task matches");
  const go = off => { params.set("offset", String(off)); history.replaceState(null, "", "tasks?" + params); refresh(); };
  place("pager", el("div", { class: "pager" },
    el("button", { type: "button", disabled: offset <= 0, onclick: () => go(Math.max(0, offset - PAGE)) }, "‹ newer"),
    el("span", { id: "range" }, total ? `${offset + 1}–${Math.min(total, offset + PAGE)} of ${total}` : "0 tasks"),
    el("button", { type: "button", disabled: offset + PAGE >= total, onclick: () => go(offset + PAGE) }, "older ›")));
}

live(["task"], refresh);
