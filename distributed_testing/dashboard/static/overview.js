// Overview: coordinators (every group member with its health, a dead one too), workers and tasks
// by state, queue depth and tasks/s over the last hour, recent failures (the first line of each
// error, the rest on the task page). Redrawn on every task, worker and load event, and every 5 s.
import { getJSON, live, el, table, place, section, state, when, chart, errorCell, taskLink, countAxis } from "./common.js";

const cards = (id, title, counts) => place(id, el("section", {}, el("h2", {}, title), el("div", { class: "cards" },
  Object.keys(counts).length ? Object.entries(counts).map(([k, v]) => el("div", { class: "card" }, el("b", {}, v), state(k)))
    : el("span", { class: "muted" }, "none"))));

async function refresh() {
  const o = await getJSON("data/overview");
  const t = table("coordinators", [["coordinator", c => c.url], ["role", c => c.role ?? "—"],
    ["health", c => state(c.healthy ? "healthy" : "unhealthy")], ["in use", c => c.in_use ? "yes" : ""],
    ["last seen", c => c.last_seen_age_s == null ? "—" : `${Math.round(c.last_seen_age_s)} s ago`, "num"],
    ["workers", c => c.health?.workers ?? "—", "num"], ["tasks", c => c.health?.tasks ?? "—", "num"],
    ["detail", c => c.error ?? ""]], o.coordinators);
  t.querySelectorAll("tbody tr").forEach((tr, i) => { if (o.coordinators[i]) tr.dataset.url = o.coordinators[i].url; });
  cards("workers-by-state", "Workers by state", o.workers_by_state);
  cards("tasks-by-state", `Tasks by state (queue depth ${o.queue_depth})`, o.tasks_by_state);
  const s = o.series, labels = s.queue_depth.map((_, i) => new Date((s.start + (i + 1) * s.bucket_s) * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }));
  const box = section("charts-box", "Last hour");
  let grid = document.getElementById("charts-grid");
  if (!grid) { grid = el("div", { class: "charts", id: "charts-grid" }); box.append(grid); }
  chart("queue-chart", "Queue depth (pending tasks at each minute)", { type: "line",
    options: { scales: { y: countAxis("pending tasks", true) } },
    data: { labels, datasets: [{ label: "pending", data: s.queue_depth, borderColor: "#b26a00", fill: false, pointRadius: 0 }] } }, grid);
  chart("rate-chart", "Tasks per second (per-minute average)", { type: "line",
    options: { scales: { y: countAxis("tasks/s") } },
    data: { labels, datasets: [
      { label: "submitted/s", data: s.submitted_per_s, borderColor: "#2f5bd3", pointRadius: 0 },
      { label: "finished/s", data: s.finished_per_s, borderColor: "#1a7f37", pointRadius: 0 }] } }, grid);
  section("failures-box", "Recent failures");
  table("failures", [["task", t => taskLink(t.task_id)], ["type", t => t.type],
    ["state", t => state(t.state)], ["worker", t => t.worker_id ?? "—"], ["when", t => when(t.updated_at)],
    ["error", t => errorCell(t.error, t.task_id), "err"]], o.recent_failures, "no failures");
  document.getElementById("failures-box").append(document.getElementById("failures"));
}

live(["task", "worker", "result", "load"], refresh, 5000);  // and every 5 s: members die without an event
