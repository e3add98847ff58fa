// Benchmarks: one model's results across hardware and over time, the model picked from those that
// have results (the newest one on open). Rows are one configuration (backend, precision, device,
// batch size) on one hardware fingerprint, side by side; a run whose latency cv (std/mean) exceeds
// 10 % is marked noisy, one whose median is over 1.5x (or under 1/1.5 of) its configuration's
// median across runs an outlier. Beside the cv stands a robust spread, the interquartile range of
// the kept latencies over their median: a few preempted rounds make the cv large while it stays small.
import { app, getJSON, live, el, table, place, section, when, num, chart, taskLink, timeAxis } from "./common.js";

const params = new URLSearchParams(location.search);
const picker = el("select", { name: "model", id: "model" });
const form = el("form", { class: "filters", id: "pick" }, el("label", {}, "model", picker));
app.append(form);
picker.addEventListener("change", () => { params.set("model", picker.value); history.replaceState(null, "", "benchmarks?" + params); refresh(); });
const quantile = (s, q) => { const p = (s.length - 1) * q, lo = Math.floor(p), hi = Math.min(lo + 1, s.length - 1); return s[lo] + (s[hi] - s[lo]) * (p - lo); };
const median = xs => { const s = [...xs].sort((a, b) => a - b); return s.length ? quantile(s, 0.5) : NaN; };
const iqrOverMedian = xs => { if (!xs?.length) return null; const s = [...xs].sort((a, b) => a - b), m = quantile(s, 0.5);
  return m > 0 ? (quantile(s, 0.75) - quantile(s, 0.25)) / m : null; };
const pct = v => v == null || !Number.isFinite(v) ? "—" : `${num(v * 100, v < 0.1 ? 2 : 1)} %`;
const head = (text, title) => el("abbr", { title }, text);

async function models() {
  const { models } = await getJSON("data/benchmark-models");
  const want = params.get("model") ?? models[0]?.model ?? "";
  const names = models.map(m => m.model);
  if (want && !names.includes(want)) names.unshift(want);  // asked for by URL, no result yet
  picker.replaceChildren(...(names.length ? names.map(n => el("option", { value: n, selected: n === want },
    n + (models.find(m => m.model === n) ? ` (${models.find(m => m.model === n).results})` : ""))) : [el("option", { value: "" }, "no results yet")]));
  picker.value = want;
  return want;
}

async function refresh() {
  const model = await models();
  if (!model) { place("bench", el("p", { class: "muted" }, "No benchmark results yet: a benchmark task's results appear here when it ends.")); return; }
  const { results } = await getJSON("data/results", { task_type: "benchmark", model, limit: 1000 });
  const runs = [];
  for (const r of results) for (const b of r.output?.batch_results ?? []) {
    const o = r.output, env = o.environment ?? {};
    runs.push({ config: `${o.backend}/${o.precision}/${o.device} bs=${b.batch_size}`, hardware: `${env.device_name ?? o.device} [${env.fingerprint_hash ?? "?"}]`,
      at: r.finished_at, task_id: r.task_id, worker: r.worker_id, median: b.latency_ms?.median, cv: b.latency_ms?.cv, iqr: iqrOverMedian(b.samples_ms),
      tput: b.throughput_items_s, verdict: b.verdict, reason: b.verdict_reason });
  }
  const groups = new Map();
  for (const r of runs) { const g = groups.get(r.config) ?? []; g.push(r); groups.set(r.config, g); }
  for (const g of groups.values()) { const m = median(g.map(r => r.median)); for (const r of g) { r.noisy = r.cv > 0.1; r.outlier = r.median > 1.5 * m || r.median < m / 1.5; } }
  runs.sort((a, b) => a.config.localeCompare(b.config) || a.hardware.localeCompare(b.hardware) || b.at - a.at);
  const t = table("bench", [["configuration", r => r.config], ["hardware", r => r.hardware], ["when", r => when(r.at)],
    ["task", r => taskLink(r.task_id)], ["median ms", r => num(r.median, 3), "num"],
    [head("cv (std/mean)", "standard deviation over mean of the latencies, as a percentage; above 10 % the run is marked noisy. A few slow rounds (preemption) make it large while the median stays put: compare the IQR beside it."),
      r => el("span", { class: r.cv > 0.1 ? "warn" : "" }, pct(r.cv)), "num"],
    [head("IQR/median", "interquartile range (p75 - p25) of the kept latencies over their median: a spread that a few outlying rounds do not move"),
      r => pct(r.iqr), "num"],
    ["items/s", r => num(r.tput, 1), "num"],
    ["measurement", r => el("span", { class: r.verdict && r.verdict !== "quiet" ? "warn" : "", title: r.reason ?? "" }, r.verdict ?? "—")],
    ["mark", r => [r.outlier ? "outlier" : "", r.noisy ? "noisy" : ""].filter(Boolean).join(", ")]], runs, `no results for ${model}`);
  t.querySelectorAll("tbody tr").forEach((tr, i) => { const r = runs[i]; if (r?.outlier) tr.classList.add("outlier"); else if (r?.noisy) tr.classList.add("noisy"); });
  const box = section("over-time", "Throughput over time");
  const series = new Map();
  for (const r of runs) { const k = `${r.config} · ${r.hardware}`; const s = series.get(k) ?? []; s.push({ x: r.at * 1000, y: r.tput }); series.set(k, s); }
  chart("time-chart", `${model}: items/s per run`, { type: "scatter",
    options: { scales: { x: timeAxis(runs.map(r => r.at * 1000)), y: { min: 0, title: { display: true, text: "items/s" } } } },
    data: { datasets: [...series].map(([label, data]) => ({ label, data, showLine: true })) } }, box);
}

live(["result"], refresh);
