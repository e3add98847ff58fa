// Workers: one row each with hardware, tags, state and why it is constrained, live load from
// heartbeats, running tasks, last heartbeat; drain for roles that may (admin).
import { getJSON, act, live, el, table, state, ago, num, canDrain, showError } from "./common.js";

const hw = w => {
  const h = w.hardware ?? {}, acc = (h.accelerators ?? h.gpus ?? []).map(a => a.name ?? a.type ?? JSON.stringify(a));
  const parts = [h.cpu_model ?? h.cpu?.model, h.cpu_count ? `${h.cpu_count} CPU` : null,
    h.memory_gb ? `${num(h.memory_gb, 1)} GB` : null, ...acc].filter(Boolean);
  return el("span", { title: JSON.stringify(h) }, parts.join(" · ") || w.capabilities.join(", ") || "—");
};
const load = w => {
  const l = w.load ?? {}, keys = Object.keys(l);
  return keys.length ? keys.map(k => `${k} ${num(l[k], 1)}`).join(", ") : "—";
};

async function drain(w) {
  if (!confirm(`Drain ${w.name}? It finishes its tasks and takes nothing new.`)) return;
  try { await act(`actions/workers/${encodeURIComponent(w.worker_id)}/drain`, {}); } catch (e) { showError(e); }
}

async function refresh() {
  const { workers } = await getJSON("data/workers");
  workers.sort((a, b) => a.name.localeCompare(b.name));
  const cols = [["name", w => w.name], ["id", w => w.worker_id], ["hardware", hw], ["tags", w => w.tags.join(", ") || "—"],
    ["state", w => el("span", {}, state(w.state), w.reason ? ` (${w.reason})` : "")],
    ["load", load], ["running", w => `${w.running.length}/${w.max_concurrent}` + (w.running.length ? `: ${w.running.join(", ")}` : "")],
    ["last heartbeat", w => ago(w.last_seen)]];
  if (canDrain) cols.push(["", w => w.state !== "disconnected" && w.state !== "draining"
    ? el("button", { class: "act drain", type: "button", onclick: () => drain(w) }, "Drain") : ""]);
  table("workers", cols, workers, "no worker has registered yet");
}

live(["worker", "load", "task"], refresh);
