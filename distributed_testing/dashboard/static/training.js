// Training: multi-node runs, their ranks, samples/s per rank, the balancing applied (shares at
// the start and the end) and the scaling efficiency against a single-node run of the same model,
// global batch and steps when one exists.
import { app, getJSON, live, el, table, place, section, when, num, chart } from "./common.js";

const params = new URLSearchParams(location.search);
const key = o => `${o.model}|${o.global_batch}|${o.steps}|${o.precision}`;
const perNode = o => o.global_samples_per_s / o.nnodes;

// A training result's output is node 0's launch record; the training document is its `metrics`
// (older results kept it at the top level). Coordinators before issue 29 stored task_type
// "benchmark" for training results, so both are read.
export const trainingDoc = out => out?.metrics?.kind === "training" ? { ...out.metrics, nnodes: out.metrics.nnodes ?? out.nnodes }
  : out?.kind === "training" ? out : null;

async function refresh() {
  const lists = await Promise.all(["training", "benchmark"].map(t => getJSON("data/results", { task_type: t, limit: 500 })));
  const runs = lists.flatMap(l => l.results).filter(r => trainingDoc(r.output))
    .map(r => ({ ...r, output: trainingDoc(r.output) })).sort((a, b) => b.finished_at - a.finished_at);
  const single = new Map();
  for (const r of runs) if (r.output.nnodes === 1 && !single.has(key(r.output))) single.set(key(r.output), r.output);
  const eff = o => { const s = single.get(key(o)); return s && o.nnodes > 1 ? perNode(o) / perNode(s) : null; };
  table("runs", [["task", r => el("a", { href: `training?task=${encodeURIComponent(r.task_id)}` }, r.task_id)], ["when", r => when(r.finished_at)],
    ["model", r => r.output.model], ["nodes", r => r.output.nnodes, "num"], ["world", r => r.output.world_size, "num"],
    ["balance", r => r.output.load_balance], ["samples/s", r => num(r.output.global_samples_per_s, 1), "num"],
    ["scaling efficiency", r => { const e = eff(r.output); return e == null ? "—" : `${num(e * 100, 1)} %`; }, "num"]], runs, "no training results yet");
  const pick = runs.find(r => r.task_id === params.get("task")) ?? runs[0];
  if (!pick) return;
  const o = pick.output, box = section("ranks-box", `Run ${pick.task_id}: ${o.model}, ${o.nnodes} node(s), ${o.world_size} rank(s), ${o.load_balance} balancing`);
  table("ranks", [["rank", r => r.rank, "num"], ["node", r => r.node_rank, "num"], ["host", r => r.hostname], ["device", r => r.device],
    ["samples/s", r => num(r.samples_per_s, 1), "num"], ["compute samples/s", r => num(r.compute_samples_per_s, 1), "num"],
    ["all-reduce wait s", r => num(r.allreduce_wait_s, 3), "num"], ["share start", r => o.shares?.initial?.[r.rank] ?? "—", "num"],
    ["share end", r => o.shares?.final?.[r.rank] ?? "—", "num"]], o.ranks);
  box.append(document.getElementById("ranks"));
  chart("rank-chart", "Samples/s per rank", { type: "bar", data: { labels: o.ranks.map(r => `rank ${r.rank}`),
    datasets: [{ label: "samples/s", data: o.ranks.map(r => r.samples_per_s), backgroundColor: "#2f5bd3" },
      { label: "compute samples/s", data: o.ranks.map(r => r.compute_samples_per_s), backgroundColor: "#8fb0ff" }] } }, box);
}

live(["result"], refresh);
