// Benchmarks: one model's results across hardware and over time. Rows are one configuration
// (backend, precision, device, batch size) on one hardware fingerprint, side by side; a run whose
// latency cv exceeds 10 % is marked noisy, one whose median is over 1.5x (or under 1/1.5 of) its
// configuration's median across runs an outlier.
import { app, getJSON, live, el, table, place, section, when, num, chart } from "./common.js";

const params = new URLSearchParams(location.search);
const form = el("form", { class: "filters", id: "pick" }, el("label", {}, "model",
  el("input", { name: "model", value: params.get("model") ?? "", placeholder: "e.g. mlp", required: true })),
  el("button", { type: "submit" }, "Show"));
app.append(form);
form.addEventListener("submit", e => { e.preventDefault(); params.set("model", form.model.value); history.replaceState(null, "", "benchmarks?" + params); refresh(); });
const median = xs => { const s = [...xs].sort((a, b) => a - b); return s.length ? (s[(s.length - 1) >> 1] + s[s.length >> 1]) / 2 : NaN; };

async function refresh() {
  const model = params.get("model");
  if (!model) { place("bench", el("p", { class: "muted" }, "Pick a model.")); return; }
  const { results } = await getJSON("data/results", { task_type: "benchmark", model, limit: 1000 });
  const runs = [];
  for (const r of results) for (const b of r.output?.batch_results ?? []) {
    const o = r.output, env = o.environment ?? {};
    runs.push({ config: `${o.backend}/${o.precision}/${o.device} bs=${b.batch_size}`, hardware: `${env.device_name ?? o.device} [${env.fingerprint_hash ?? "?"}]`,
      at: r.finished_at, task_id: r.task_id, worker: r.worker_id, median: b.latency_ms?.median, cv: b.latency_ms?.cv, tput: b.throughput_items_s,
        verdict: b.verdict, reason: b.verdict_reason });
  }
  const groups = new Map();
  for (const r of runs) { const g = groups.get(r.config) ?? []; g.push(r); groups.set(r.config, g); }
  for (const g of groups.values()) { const m = median(g.map(r => r.median)); for (const r of g) { r.noisy = r.cv > 0.1; r.outlier = r.median > 1.5 * m || r.median < m / 1.5; } }
  runs.sort((a, b) => a.config.localeCompare(b.config) || a.hardware.localeCompare(b.hardware) || b.at - a.at);
  const t = table("bench", [["configuration", r => r.config], ["hardware", r => r.hardware], ["when", r => when(r.at)],
    ["task", r => el("a", { href: `tasks/${encodeURIComponent(r.task_id)}` }, r.task_id)], ["median ms", r => num(r.median, 3), "num"],
    ["cv", r => num(r.cv, 3), "num"], ["items/s", r => num(r.tput, 1), "num"],
    ["measurement", r => el("span", { class: r.verdict && r.verdict !== "quiet" ? "warn" : "", title: r.reason ?? "" }, r.verdict ?? "—")],
    ["mark", r => [r.outlier ? "outlier" : "", r.noisy ? "noisy" : ""].filter(Boolean).join(", ")]], runs, `no results for ${model}`);
  t.querySelectorAll("tbody tr").forEach((tr, i) => { const r = runs[i]; if (r?.outlier) tr.classList.add("outlier"); else if (r?.noisy) tr.classList.add("noisy"); });
  const box = section("over-time", "Throughput over time");
  const series = new Map();
  for (const r of runs) { const k = `${r.config} · ${r.hardware}`; const s = series.get(k) ?? []; s.push({ x: r.at * 1000, y: r.tput }); series.set(k, s); }
  chart("time-chart", `${model}: items/s per run`, { type: "scatter",
    options: { scales: { x: { type: "linear", ticks: { callback: v => new Date(v).toLocaleString() } }, y: { title: { display: true, text: "items/s" } } } },
    data: { datasets: [...series].map(([label, data]) => ({ label, data, showLine: true })) } }, box);
}

live(["result"], refresh);
