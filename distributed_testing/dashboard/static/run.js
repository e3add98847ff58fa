// One run: its name, who submitted it, state, start and duration, its tasks' counts by state, and
// its tasks, failures first (as the coordinator orders them), each with its worker, start,
// duration, test counts in pytest's words, the first line of its error and its failing tests, and
// a link to its page. Cancel and Re-run (failed) for a key that may: an admin, or the submitter
// key that created the run (the coordinator checks again). Redrawn on each event of one of its tasks.
import { app, getJSON, act, live, el, table, place, section, state, when, num, seconds, counts, took,
  errorCell, taskLink, outcome, canCancel, canRerun, showError } from "./common.js";

const id = app.dataset.runId;
const TEST_WORDS = [["passed", "passed"], ["failed", "failed"], ["errors", "error"], ["skipped", "skipped"], ["xfailed", "xfailed"]];
const tests = t => t.tests ? el("span", { class: "tests" }, TEST_WORDS.filter(([k]) => t.tests[k]).flatMap(([k, word], i) =>
  [i ? ", " : "", `${t.tests[k]} `, outcome(word)])) : "";
const FINISHED = ["succeeded", "failed", "cancelled"];

async function cancel(run) {
  if (!confirm(`Cancel every unfinished task of ${run.name}?`)) return;
  try {
    const r = await act(`actions/runs/${encodeURIComponent(id)}/cancel`);
    place("done", el("p", { class: "muted", role: "status" }, `Cancelled ${r.cancelled.length} task(s); ${r.finished} had finished.`));
  } catch (e) { showError(e); }
}

async function rerun(run, failed) {
  try {
    const r = await act(`actions/runs/${encodeURIComponent(id)}/rerun`, { failed });
    location.href = `runs/${encodeURIComponent(r.run_id)}`;
  } catch (e) { showError(e); }
}

async function refresh() {
  const run = await getJSON(`data/runs/${encodeURIComponent(id)}`);
  document.querySelector("h1").textContent = `Run ${run.name}`;
  const mine = app.dataset.role === "admin" || run.submitted_by === app.dataset.keyId;
  const failures = run.tasks.filter(t => ["failed", "timed_out", "error", "cancelled"].includes(t.state)).length;
  place("summary", el("div", { class: "cards" },
    el("div", { class: "card" }, el("b", {}, state(run.state)), "state"), el("div", { class: "card" }, el("b", {}, run.total), "tasks"),
    el("div", { class: "card" }, el("b", {}, counts(run.counts)), "by state"),
    el("div", { class: "card" }, el("b", {}, run.submitted_by ?? "—"), "submitted by"),
    el("div", { class: "card" }, el("b", {}, when(run.started_at ?? run.created_at)), run.started_at ? "started" : "created"),
    el("div", { class: "card" }, el("b", {}, seconds(took(run))), run.ended_at ? "took" : "so far")));
  place("actions", el("div", { class: "actions" },
    canCancel && mine && !FINISHED.includes(run.state)
      ? el("button", { class: "act cancel", type: "button", onclick: () => cancel(run) }, "Cancel run") : null,
    canRerun && mine && failures
      ? el("button", { class: "act rerun", type: "button", onclick: () => rerun(run, true) }, `Re-run failed (${failures})`) : null,
    canRerun && mine && FINISHED.includes(run.state)
      ? el("button", { class: "act rerun all", type: "button", onclick: () => rerun(run, false) }, "Re-run all") : null,
    run.labels?.rerun_of ? el("span", {}, "re-run of ", el("a", { href: `runs/${encodeURIComponent(run.labels.rerun_of)}` }, run.labels.rerun_of)) : null,
    el("span", { class: "muted" }, [`id ${run.run_id}`, ...Object.entries(run.labels ?? {}).filter(([k]) => k !== "rerun_of").map(([k, v]) => `${k}=${v}`)].join(" · "))));
  const box = section("tasks-box", "Tasks (failures first)");
  table("run-tasks", [["task", t => taskLink(t.task_id)], ["type", t => t.type], ["state", t => state(t.state)],
    ["worker", t => t.worker_id ?? "—"], ["started", t => when(t.started_at)], ["duration", t => t.duration_s == null ? "—" : `${num(t.duration_s, 2)} s`, "num"],
    ["tests", tests], ["error", t => el("span", {}, errorCell(t.error_line, t.task_id),
      t.tests?.failing?.length ? el("ul", { class: "failing" }, t.tests.failing.map(n => el("li", {}, n))) : null), "err"]],
  run.tasks, "no task has joined this run yet");
  box.append(document.getElementById("run-tasks"));
}

live(["task"], refresh, undefined, (_, t) => t.run_id === undefined || t.run_id === id);  // this run's tasks only
