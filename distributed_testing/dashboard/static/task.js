// Task detail: spec, every attempt with its worker and timings, per-test results, benchmark
// results as a table and as charts (latency and throughput against batch size, per precision and
// backend), the environment fingerprint, and the task's output, streamed while it runs (the
// coordinator's long poll, data/tasks/ID/logs?follow=1), with a running attempt's elapsed time.
// Redrawn when this task changes.
import { app, getJSON, act, live, el, table, place, section, state, when, num, chart, canCancel, showError, outcome } from "./common.js";

const id = app.dataset.taskId;
const kv = (obj) => el("dl", { class: "kv" }, Object.entries(obj ?? {}).flatMap(([k, v]) =>
  [el("dt", {}, k), el("dd", {}, v == null ? "—" : typeof v === "object" ? JSON.stringify(v) : String(v))]));

function attempts(task, results) {
  const by = new Map();
  for (const h of task.history) {
    if (!h.attempt) continue;
    const a = by.get(h.attempt) ?? { attempt: h.attempt, worker: h.worker_id, steps: [] };
    a.steps.push(h); by.set(h.attempt, a);
  }
  for (const r of results) { const a = by.get(r.attempt) ?? { attempt: r.attempt, worker: r.worker_id, steps: [] }; a.result = r; by.set(r.attempt, a); }
  return [...by.values()].sort((a, b) => a.attempt - b.attempt);
}

function benchmark(out, box) {
  const rows = out.batch_results ?? [];
  table("bench-table", [["batch size", r => r.batch_size, "num"], ["iterations", r => r.iterations, "num"],
    ["median ms", r => num(r.latency_ms?.median, 3), "num"], ["p90 ms", r => num(r.latency_ms?.p90, 3), "num"],
    ["p99 ms", r => num(r.latency_ms?.p99, 3), "num"], ["cv", r => el("span", { class: r.latency_ms?.cv > 0.1 ? "warn" : "" }, num(r.latency_ms?.cv, 3)), "num"],
    ["items/s", r => num(r.throughput_items_s, 1), "num"], ["peak MB", r => num(r.peak_memory_mb, 0), "num"],
    ["measurement", r => el("span", { class: r.verdict && r.verdict !== "quiet" ? "warn" : "", title: r.verdict_reason ?? "" },
      r.verdict ?? "—")]], rows);
  box.append(document.getElementById("bench-table"));
  let grid = document.getElementById("bench-charts");
  if (!grid) { grid = el("div", { class: "charts", id: "bench-charts" }); box.append(grid); }
  const label = `${out.backend}/${out.precision} on ${out.device}`;
  const pts = f => rows.map(r => ({ x: r.batch_size, y: f(r) }));
  const opts = y => ({ scales: { x: { type: "linear", title: { display: true, text: "batch size" } }, y: { title: { display: true, text: y } } } });
  chart("latency-chart", "Latency against batch size", { type: "line", options: opts("median latency (ms)"),
    data: { datasets: [{ label, data: pts(r => r.latency_ms?.median), borderColor: "#2f5bd3" }] } }, grid);
  chart("throughput-chart", "Throughput against batch size", { type: "line", options: opts("items/s"),
    data: { datasets: [{ label, data: pts(r => r.throughput_items_s), borderColor: "#1a7f37" }] } }, grid);
}

// The output as streamed so far: the attempt it belongs to, the offset to ask from next, and the
// timing of the attempt (its start and the coordinator's clock, for the elapsed time).
const log = { attempt: null, offset: 0, text: "", complete: false, following: false, startedAt: null, skew: 0, endedS: null };

function elapsed() {
  if (log.startedAt == null) return "—";
  const s = log.endedS ?? (Date.now() / 1000 - log.skew - log.startedAt);
  return s < 60 ? `${num(s, 1)} s` : `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}

function showLog() {
  const pre = document.getElementById("output-log");
  if (!pre) return;
  const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  pre.textContent = log.text || (log.complete ? "(no output recorded)" : "(no output yet)");
  if (atEnd) pre.scrollTop = pre.scrollHeight;
}

async function follow() {
  if (log.following) return;
  log.following = true;
  try {
    for (;;) {
      const page = await getJSON(`data/tasks/${encodeURIComponent(id)}/logs`,
        { offset: log.offset, follow: 1, wait: 3, attempt: log.attempt ?? "" });
      if (log.attempt !== null && page.attempt !== log.attempt) log.text = "";  // a new attempt: its own output
      log.attempt = page.attempt; log.offset = page.next_offset; log.text += page.text; log.complete = page.complete;
      log.startedAt = page.started_at;
      log.endedS = page.complete ? page.elapsed_s : null;
      if (page.started_at != null && page.elapsed_s != null) log.skew = Date.now() / 1000 - (page.started_at + page.elapsed_s);
      showLog();
      const e = document.getElementById("elapsed");
      if (e) e.textContent = elapsed();
      if (page.complete) return;
    }
  } catch (e) { showError(e); } finally { log.following = false; }
}

setInterval(() => {
  const e = document.getElementById("elapsed");
  if (e && !log.complete) e.textContent = elapsed();
}, 1000);

async function refresh() {
  const [task, res] = await Promise.all([getJSON(`data/tasks/${encodeURIComponent(id)}`, { result: "0" }),
    getJSON("data/results", { task_id: id, limit: 100 })]);
  document.querySelector("h1").textContent = `Task ${task.task_id}`;
  place("summary", el("div", { class: "cards" },
    el("div", { class: "card" }, el("b", {}, state(task.state)), "state"), el("div", { class: "card" }, el("b", {}, task.type), "type"),
    el("div", { class: "card" }, el("b", {}, task.attempt), "attempts"), el("div", { class: "card" }, el("b", {}, task.worker_id ?? "—"), "worker"),
    el("div", { class: "card" }, el("b", { id: "elapsed" }, elapsed()), ["assigned", "running"].includes(task.state) ? "running for" : "ran"),
    task.pending_reason ? el("div", { class: "card" }, el("b", {}, "waiting"), task.pending_reason) : null,
    canCancel && ["pending", "assigned", "running"].includes(task.state) ? el("button", { class: "act cancel", type: "button",
      onclick: () => act(`actions/tasks/${encodeURIComponent(id)}/cancel`).catch(showError) }, "Cancel") : null));
  const s1 = section("attempts-box", "Attempts");
  table("attempts", [["attempt", a => a.attempt, "num"], ["worker", a => a.worker ?? "—"],
    ["timeline", a => a.steps.map(h => `${h.to} ${new Date(h.at * 1000).toLocaleTimeString()} (${h.cause})`).join(" → ")],
    ["result", a => a.result ? state(a.result.status) : "—"],
    ["ran", a => a.result ? `${num(a.result.finished_at - a.result.started_at, 3)} s` : "—", "num"],
    ["error", a => a.result?.error ?? ""]], attempts(task, res.results));
  s1.append(document.getElementById("attempts"));
  const latest = res.results.find(r => r.attempt === task.outcome?.attempt) ?? res.results[0];
  const out = latest?.output ?? {};
  if (Array.isArray(out.tests)) {
    const s = section("tests-box", `Tests: ${out.passed ?? 0} passed, ${out.failed ?? 0} failed, ${out.skipped ?? 0} skipped`);
    table("tests", [["test", t => t.nodeid], ["outcome", t => outcome(t.outcome)],
      ["s", t => num(t.duration_s, 3), "num"], ["message", t => t.message ?? ""]], out.tests);
    s.append(document.getElementById("tests"));
  }
  if (Array.isArray(out.batch_results)) benchmark(out, section("bench-box", `Benchmark: ${out.model} (${out.backend}, ${out.precision}, ${out.device}${out.weights === "random" ? ", random weights" : ""}${out.threads ? `, ${out.threads} thread(s)` : ""})`));
  const doc = out.metrics?.kind === "training" ? out.metrics : out.kind === "training" ? out : null;
  if (doc) {
    const s = section("training-box", `Training ranks: ${num(doc.global_samples_per_s, 1)} samples/s over ${doc.world_size} rank(s)`);
    table("task-ranks", [["rank", r => r.rank, "num"], ["node", r => r.node_rank, "num"], ["host", r => r.hostname],
      ["device", r => r.device], ["samples/s", r => num(r.samples_per_s, 1), "num"],
      ["all-reduce wait s", r => num(r.allreduce_wait_s, 3), "num"]], doc.ranks ?? []);
    s.append(document.getElementById("task-ranks"));
    s.append(el("p", {}, el("a", { href: `training?task=${encodeURIComponent(id)}` }, "open in the Training page")));
  }
  if (out.environment) { const s = section("env-box", "Environment fingerprint"); place("env", kv(out.environment)); s.append(document.getElementById("env")); }
  const s2 = section("output-box", "Output");
  if (!document.getElementById("output-log")) s2.append(el("pre", { id: "output-log", style: "max-height: 40em; overflow: auto" }));
  const failure = [out.traceback, latest?.error].filter(Boolean).join("\n");
  place("output-error", el("pre", { hidden: !failure }, failure)); s2.append(document.getElementById("output-error"));
  showLog();
  if (!log.complete) follow();
  const s3 = section("spec-box", "Spec");
  place("spec", el("pre", {}, JSON.stringify(task.spec, null, 2))); s3.append(document.getElementById("spec"));
}

live(["task", "result"], refresh);
