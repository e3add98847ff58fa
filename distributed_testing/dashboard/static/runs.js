// Runs: every run (the tasks of one submission: a task file, a pytest session, an API call), newest
// first, with its name, who submitted it, its state, its tasks' counts by state, its start and how
// long it has taken. A run's name opens its page. Redrawn on every task event.
import { app, getJSON, live, el, table, place, state, when, seconds, counts, took } from "./common.js";

const LIMIT = 50;
const params = new URLSearchParams(location.search);
const STATES = ["", "queued", "running", "succeeded", "failed", "cancelled"];
const pick = el("select", { name: "state" }, STATES.map(s => el("option", { value: s, selected: s === (params.get("state") ?? "") }, s || "any")));
app.append(el("form", { class: "filters", id: "filters" }, el("label", {}, "state", pick)));
pick.addEventListener("change", () => { if (pick.value) params.set("state", pick.value); else params.delete("state");
  history.replaceState(null, "", "runs" + (params.size ? "?" + params : "")); refresh(); });

async function refresh() {
  const { runs } = await getJSON("data/runs", { limit: LIMIT, state: params.get("state") });
  table("runs", [["run", r => el("a", { href: `runs/${encodeURIComponent(r.run_id)}` }, r.name)], ["id", r => r.run_id],
    ["by", r => r.submitted_by ?? "—"], ["state", r => state(r.state)], ["tasks", r => counts(r.counts)],
    ["total", r => r.total, "num"], ["started", r => when(r.started_at ?? r.created_at)],
    ["duration", r => (r.ended_at == null && r.started_at != null ? "running for " : "") + seconds(took(r)), "num"]],
  runs, params.get("state") ? `no ${params.get("state")} run` : "no run yet: dt submit and pytest --dt-coordinator create one each");
  place("runs-note", el("p", { class: "muted" }, `The newest ${LIMIT} runs at most.`));
}

live(["task"], refresh);
