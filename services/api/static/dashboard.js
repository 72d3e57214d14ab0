// Rallypoint dashboard: plain JS + SVG over the public API (/v1/nodes, /v1/jobs, /v1/jobs/{id}, /v1/state,
// /v1/queues, /v1/usage/history, /v1/history). No build step, nothing from the internet.
// Routes: #/ (cluster), #/job/<id> (a job), #/history.
"use strict";

const TOKEN_KEY = "rallypoint.token";
const REFRESH_MS = 2000;
const ACTIVE = "bound,running,repairing";
const ENDED = "completed,failed,cancelled";
const SVG_NS = "http://www.w3.org/2000/svg";
const USAGE_REFRESH_MS = 10000; // the usage series is computed from the log: asked for less often
let usageSeries = null; // the last /v1/usage/history answer and when it came: {at, series}
let timer = null;

// --- token and API --------------------------------------------------------------------------------

function takeTokenFromUrl() {
  const params = new URLSearchParams(location.search);
  const given = params.get("token");
  if (!given) return;
  localStorage.setItem(TOKEN_KEY, given);
  params.delete("token"); // keep it out of the address bar, the history and screenshots
  const query = params.toString();
  history.replaceState(null, "", location.pathname + (query ? `?${query}` : "") + location.hash);
}

class Unauthorized extends Error {
  constructor(path, status, detail) { super(path); this.status = status; this.detail = detail; }
}

// While the event log is unreachable the API refuses its default (linearizable) reads with 503
// log-unavailable; the page then asks again with ?stale=true and says it shows the API's last known view.
const LOG_UNAVAILABLE = "https://rallypoint.dev/problems/log-unavailable";
let staleSeq = null; // the log position of the stale answers of this render; null: none was stale

async function get(path) {
  const headers = {};
  const token = localStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  return fetch(path, { headers });
}

async function logUnavailable(response) {
  if (response.status !== 503) return false;
  try { return (await response.json()).type === LOG_UNAVAILABLE; } catch (error) { return false; }
}

async function api(path) {
  let response = await get(path);
  if (await logUnavailable(response)) {
    response = await get(`${path}${path.includes("?") ? "&" : "?"}stale=true`);
    const seq = Number(response.headers.get("Rally-Log-Seq"));
    if (response.ok) staleSeq = Math.max(staleSeq ?? 0, seq);
  }
  if (response.status === 401 || response.status === 403) {
    throw new Unauthorized(path, response.status, await problemDetail(response));
  }
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

async function problemDetail(response) {
  try { return (await response.json()).detail || ""; } catch (error) { return ""; }
}

function showStale() {
  const banner = document.getElementById("stale-banner");
  banner.hidden = staleSeq === null;
  banner.textContent = staleSeq === null ? ""
    : `The event log is unreachable: showing this API's last known view (log position ${staleSeq}).`;
}

async function optional(path) {
  try { return await api(path); } catch (error) { if (error instanceof Unauthorized) throw error; return null; }
}

function showLogin(message) {
  document.getElementById("login").hidden = false;
  document.getElementById("view").replaceChildren();
  document.getElementById("login-error").textContent = message || "";
}

// A token kept from before can stop working: the cluster was reset or is another one (a local cluster's
// folder removed, another `rally up`), or the token was revoked. Say which refusal it was and where a new
// token comes from, rather than only asking for one.
function refusedTokenMessage(error) {
  const said = error.detail ? `: ${error.detail}` : "";
  return `The API refused the token kept in this browser (HTTP ${error.status}${said}). It may be from another `
    + "cluster, or from this one before it was reset, or it was revoked. Get a new one: `rally tokens create "
    + "--team TEAM` (or --admin) in the cluster's folder, or use the token `rally up` printed (a local "
    + "cluster keeps them in .rally/tokens.json).";
}

// --- tiny DOM helpers ------------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== null && value !== undefined) node.setAttribute(key, value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== null && value !== undefined) node.setAttribute(key, value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

function title(text) { return svg("title", {}, text); }
function link(href, text) { return el("a", { href }, text); }

// Team colours by a stable team index: the team's place among the cluster's configured teams (/v1/queues,
// sorted: the same on every page, reload and browser), then teams met outside that list in the order seen.
// The first eight are a fixed palette chosen so every pair differs by at least 50 in CIE76 delta-E (two
// teams never look alike) and none is near the orange and red that mean draining and unhealthy, nor the
// free and background greys; beyond eight, hues step by the golden angle away from red and orange.
const TEAM_PALETTE = ["#3c71dd", "#e8e830", "#ed5ebe", "#30c9e8", "#30e830", "#ecb093", "#99e699", "#1717cf"];
const teamIndex = new Map();

function knowTeams(names) {
  for (const name of [...names].sort()) if (!teamIndex.has(name)) teamIndex.set(name, teamIndex.size);
}

function colorAt(index) {
  if (index < TEAM_PALETTE.length) return TEAM_PALETTE[index];
  const hue = 60 + ((index * 137.508) % 260); // 60..320: no red, no orange
  return `hsl(${hue.toFixed(0)}, 70%, ${index % 2 ? 62 : 48}%)`;
}

function teamColor(team) {
  knowTeams([team]);
  return colorAt(teamIndex.get(team));
}

let teamsKnown = false;

async function loadTeams() {
  if (teamsKnown) return;
  const queues = await optional("/v1/queues");
  knowTeams(((queues && queues.teams) || []).map((q) => q.team));
  teamsKnown = true;
}

function when(seconds) {
  return seconds ? new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 19) : "—";
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 120) return `${seconds.toFixed(1)} s`;
  if (seconds < 7200) return `${(seconds / 60).toFixed(1)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

// --- cluster view: heat map, queue, team usage -----------------------------------------------------

const NODE_COLORS = { drained: "var(--drained)", lost: "var(--unhealthy)", unreachable: "var(--unhealthy)" };

function gpuOwners(jobs) {
  const owners = new Map(); // "node/gpu" -> job
  for (const job of jobs) {
    for (const task of job.allocation) {
      for (const gpu of task.gpus) owners.set(`${task.node_id}/${gpu}`, job);
    }
  }
  return owners;
}

// job id -> its drain plan, from the job's own `drain` field or its node's `draining_jobs` (either may be
// absent: an API without drain plans still marks the job, from its node's status)
function drainPlans(nodes, jobs) {
  const plans = new Map();
  for (const node of nodes) {
    for (const entry of node.draining_jobs || []) plans.set(entry.job_id, { node: node.node_id, ...entry });
  }
  // the job's own field wins: it carries the reason too
  for (const job of jobs) if (job.drain) plans.set(job.job_id, job.drain);
  return plans;
}

// A drain plan in words. Its fields may come flat ({node, plan, deadline, reason}) or with the plan nested
// ({node_id, reason, plan: {plan, deadline, detail}}): both are read.
function drainText(drain) {
  if (!drain) return "";
  const inner = drain.plan && typeof drain.plan === "object" ? drain.plan : drain;
  const kind = typeof inner.plan === "string" ? inner.plan : "";
  const leaves = { now: "leaves now", "after-checkpoint": "leaves after its next checkpoint",
    "at-deadline": "leaves at the deadline" }[kind] || "still runs there";
  const deadline = inner.deadline ?? drain.deadline;
  const by = deadline ? ` (by ${when(deadline)})` : "";
  const why = drain.reason ? `: ${drain.reason}` : "";
  return `node ${drain.node || drain.node_id || "?"} draining, ${leaves}${by}${why}`;
}

function cellLook(node, owner, unseen) {
  const out = NODE_COLORS[node.status]; // the node is not up
  if (owner && (!out || node.status === "drained")) return ["busy", teamColor(owner.team)];
  if (out) return [node.status === "drained" ? "draining" : "unhealthy", out];
  return unseen ? ["busy", "var(--other-team)"] : ["free", "var(--free)"];
}

function gpuCell(node, gpu, owner, unseen, plans, geometry) {
  const { x, y, cell } = geometry;
  const [state, fill] = cellLook(node, owner, unseen);
  // a job on a draining node stays on its GPUs, outlined as draining: it still runs there until it leaves
  const draining = Boolean(owner) && state === "busy" && node.status === "drained";
  const shown = state === "busy" ? owner : null;
  const about = shown ? `GPU ${gpu}: ${shown.name} (${shown.team}) ${shown.state}`
    + (draining ? ` · ${drainText(plans.get(shown.job_id) || { node: node.node_id })}` : "")
    : unseen && state === "busy" ? `GPU ${gpu}: busy (another team's job)` : `GPU ${gpu}: ${state}`;
  // a GPU fractional jobs share: how much of it they hold (the owner shown is one of them)
  const sharedMilli = (node.shared_gpus || {})[String(gpu)];
  const slices = (node.mig_gpus || {})[String(gpu)];
  const sharedText = sharedMilli ? ` · shared: ${sharedMilli / 1000} of it held by fractional jobs`
    : slices ? ` · MIG: ${slices.map((c) => `${c.profile}@${c.start}`).join(", ") || "no slice in use"}` : "";
  const rect = svg("rect", {
    class: draining ? "gpu draining-job" : "gpu", x, y, width: cell, height: cell, rx: 3, fill,
    "data-shared": sharedMilli ? String(sharedMilli) : null,
    "data-mig": slices ? slices.map((c) => `${c.profile}@${c.start}`).join(",") || "-" : null,
    "data-node": node.node_id, "data-gpu": gpu, "data-state": state, "data-draining": draining ? "true" : null,
    "data-job": shown ? shown.job_id : null, "data-team": shown ? shown.team : null,
  }, title(about + sharedText));
  if (shown) {
    rect.style.cursor = "pointer";
    rect.addEventListener("click", () => { location.hash = `#/job/${shown.job_id}`; });
  }
  return rect;
}

function heatMap(nodes, owners, plans) {
  const racks = new Map();
  for (const node of [...nodes].sort((a, b) => a.node_id.localeCompare(b.node_id))) {
    if (!racks.has(node.rack)) racks.set(node.rack, []);
    racks.get(node.rack).push(node);
  }
  const cell = 18, gap = 3, labelWidth = 150, rowHeight = cell + 8;
  const container = el("div", { id: "heatmap" });
  for (const [rack, members] of [...racks].sort()) {
    const widest = Math.max(...members.map((n) => n.gpus.total));
    const picture = svg("svg", {
      class: "rack-map", "data-rack": rack,
      width: labelWidth + widest * (cell + gap), height: members.length * rowHeight,
    });
    members.forEach((node, row) => {
      const y = row * rowHeight;
      const group = svg("g", { class: "node", "data-node": node.node_id, "data-status": node.status });
      const status = node.status === "up" ? "" : ` (${node.status})`;
      const leaving = (node.draining_jobs || []).map((j) => `${j.job_id}: ${drainText({ node: node.node_id, ...j })}`).join(", ");
      group.append(svg("text", { x: 0, y: y + cell - 4, class: node.status === "up" ? "" : "label" },
        `${node.node_id}${status}`, title(`${node.node_id} ${node.gpu_type} ${node.status} `
          + `${node.status_reason || ""}${leaving ? ` · leaving: ${leaving}` : ""}`)));
      // GPUs held by a job this token may not see (another team's): busy, with no job named
      const busy = new Set(node.busy_gpus || []);
      for (let gpu = 0; gpu < node.gpus.total; gpu++) {
        const owner = owners.get(`${node.node_id}/${gpu}`);
        const unseen = !owner && busy.has(gpu);
        group.append(gpuCell(node, gpu, owner, unseen, plans, { x: labelWidth + gpu * (cell + gap), y, cell }));
      }
      picture.append(group);
    });
    container.append(el("div", { class: "rack" }, el("div", { class: "rack-title" }, `rack ${rack}`), picture));
  }
  return container;
}

function legend(teams, othersBusy) {
  const items = [["free", "var(--free)"], ["draining", "var(--drained)"], ["unhealthy", "var(--unhealthy)"],
    ...teams.map((t) => [`busy: ${t}`, teamColor(t)]),
    ...(othersBusy ? [["busy: another team", "var(--other-team)"]] : [])];
  return el("div", { class: "legend" },
    ...items.map(([label, color]) => el("span", {}, el("i", { style: `background:${color}` }), label)),
    el("span", {}, el("i", { class: "draining-job" }), "job on a draining node"));
}

function queueTable(pending) {
  const rows = [...pending].sort((a, b) => (a.queue_position ?? 1e12) - (b.queue_position ?? 1e12)
    || a.submitted_seq - b.submitted_seq);
  const now = Date.now() / 1000;
  const table = el("table", { id: "queue" }, el("tr", {}, ...["#", "job", "team", "GPUs", "priority", "waiting",
    "predicted start", "reason"].map((h) => el("th", {}, h))));
  for (const job of rows) {
    const reason = job.pending_reason || {};
    table.append(el("tr", { class: "queue-row", "data-job": job.job_id },
      el("td", {}, job.queue_position === null ? "—" : String(job.queue_position)),
      el("td", {}, link(`#/job/${job.job_id}`, job.name)),
      el("td", {}, job.team), el("td", {}, String(job.gpus)), el("td", {}, job.priority),
      el("td", {}, duration(now - job.submitted_at)),
      el("td", { class: "predicted-start" }, startText(job.predicted_start, now)),
      el("td", {}, el("b", {}, reason.code || ""), " ", reason.message || "")));
  }
  if (!rows.length) table.append(el("tr", {}, el("td", { colspan: 8, class: "muted" }, "nothing waiting")));
  return table;
}

// A waiting job's predicted start (docs/prediction.md): "in 12m (p90 40m)", as `rally jobs` shows it.
function startText(predicted, now) {
  if (!predicted) return "—";
  if (predicted.status === "predicted" || predicted.status === "estimated") {
    const rough = predicted.status === "estimated" ? "~" : "";
    const p50 = rough + (predicted.p50 <= now ? "now" : `in ${duration(predicted.p50 - now)}`);
    const p90 = predicted.p90 !== null && predicted.p90 > predicted.p50
      ? ` (p90 ${predicted.p90 <= now ? "now" : duration(predicted.p90 - now)})` : "";
    return p50 + p90;
  }
  if (predicted.status === "beyond-horizon") return `beyond ${duration(predicted.horizon_s)}`;
  if (predicted.status === "pending-refresh") return "soon known";
  return "unknown";
}

function teamTable(active, pending, queues) {
  const teams = new Map();
  const row = (team) => {
    if (!teams.has(team)) teams.set(team, { held: 0, running: 0, pendingJobs: 0, pendingGpus: 0 });
    return teams.get(team);
  };
  for (const job of active) {
    const t = row(job.team);
    t.held += job.allocation.reduce((sum, task) => sum + task.gpus.length, 0);
    t.running += 1;
  }
  for (const job of pending) { const t = row(job.team); t.pendingJobs += 1; t.pendingGpus += job.gpus; }
  const nominal = new Map(((queues && queues.teams) || []).map((q) => [q.team, q.nominal]));
  const table = el("table", { id: "teams" }, el("tr", {}, ...["team", "GPUs held", "nominal quota", "jobs active",
    "jobs waiting", "GPUs waiting"].map((h) => el("th", {}, h))));
  for (const [team, t] of [...teams].sort()) {
    const quota = nominal.get(team);
    table.append(el("tr", { class: "team-row", "data-team": team },
      el("td", {}, swatch(team), " ", team),
      el("td", {}, String(t.held)), el("td", {}, quota === undefined || quota === null ? "—" : String(quota)),
      el("td", {}, String(t.running)),
      el("td", {}, String(t.pendingJobs)), el("td", {}, String(t.pendingGpus))));
  }
  return { table };
}

function swatch(team) {
  return el("i", { class: "swatch", "data-team": team, style: `background:${teamColor(team)}` });
}

function runningTable(active, plans, nodesById) {
  const now = Date.now() / 1000;
  const rows = [...active].sort((a, b) => (a.started_at ?? a.bound_at ?? 0) - (b.started_at ?? b.bound_at ?? 0));
  const table = el("table", { id: "running" }, el("tr", {}, ...["job", "team", "state", "GPUs", "nodes",
    "running for", "attempt", "drain"].map((h) => el("th", {}, h))));
  for (const job of rows) {
    const drainedNode = job.nodes.find((n) => (nodesById.get(n) || {}).status === "drained");
    const plan = plans.get(job.job_id) || (drainedNode ? { node: drainedNode } : null);
    const held = job.allocation.reduce((sum, task) => sum + task.gpus.length, 0);
    table.append(el("tr", { class: "running-row", "data-job": job.job_id, "data-draining": plan ? "true" : null },
      el("td", {}, link(`#/job/${job.job_id}`, job.name)), el("td", {}, swatch(job.team), " ", job.team),
      el("td", {}, job.state), el("td", {}, String(held)), el("td", {}, job.nodes.join(", ") || "—"),
      el("td", {}, job.started_at ? duration(now - job.started_at) : "—"), el("td", {}, String(job.attempt)),
      el("td", { class: plan ? "draining-text" : "muted" }, plan ? drainText(plan) : "—")));
  }
  if (!rows.length) table.append(el("tr", {}, el("td", { colspan: 8, class: "muted" }, "nothing running")));
  return table;
}

function clock(seconds) {
  return new Date(seconds * 1000).toISOString().slice(11, 19); // UTC, as every time on these pages
}

// GPUs in use per team over time, from the log (/v1/usage/history): one step line per team, with a
// GPU axis (0, half, the cluster's total) and a time axis (the window's start, middle and end).
function usageChart(series, totalGpus) {
  const width = 560, height = 190, left = 44, right = 14, top = 10, bottom = 40;
  const chart = svg("svg", { id: "usage-chart", class: "fit", width, height, viewBox: `0 0 ${width} ${height}`,
    "data-since": series ? series.since : null, "data-step": series ? series.step_s : null });
  if (!series) {
    chart.append(svg("text", { x: left, y: 30, class: "label" }, "no usage history from this API"));
    return chart;
  }
  const t0 = series.since, t1 = series.until;
  const peak = Math.max(1, totalGpus, ...series.teams.flatMap((t) => t.gpus));
  const x = (t) => left + ((t - t0) / Math.max(1, t1 - t0)) * (width - left - right);
  const y = (v) => height - bottom - (v / peak) * (height - top - bottom);
  const middle = top + (height - top - bottom) / 2;
  chart.append(svg("line", { class: "axis", x1: left, y1: y(0), x2: width - right, y2: y(0) }),
    svg("line", { class: "axis", x1: left, y1: y(0), x2: left, y2: y(peak) }),
    svg("text", { x: 12, y: middle, class: "label axis-title", transform: `rotate(-90 12 ${middle})`,
      "text-anchor": "middle" }, "GPUs"),
    svg("text", { x: left + (width - left - right) / 2, y: height - 6, class: "label axis-title",
      "text-anchor": "middle" }, `time (UTC), a point per ${duration(series.step_s)}`));
  for (const v of [...new Set([0, Math.round(peak / 2), peak])]) {
    chart.append(svg("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end", class: "label tick" }, String(v)));
  }
  for (const [t, anchor] of [[t0, "start"], [(t0 + t1) / 2, "middle"], [t1, "end"]]) {
    chart.append(svg("text", { x: x(t), y: height - bottom + 14, "text-anchor": anchor, class: "label tick" }, clock(t)));
  }
  for (const team of series.teams) {
    const points = team.gpus.flatMap((v, i) => {
      const end = i + 1 < series.starts.length ? series.starts[i + 1] : t1;
      return [`${x(series.starts[i]).toFixed(1)},${y(v).toFixed(1)}`, `${x(end).toFixed(1)},${y(v).toFixed(1)}`];
    }).join(" ");
    chart.append(svg("polyline", { class: "usage-line", "data-team": team.team, points, fill: "none",
      stroke: teamColor(team.team), "stroke-width": 2 }, title(`${team.team}: ${(team.gpu_s / 3600).toFixed(2)} GPU-hours`)));
  }
  return chart;
}

async function usageHistory() {
  if (usageSeries && Date.now() - usageSeries.at < USAGE_REFRESH_MS) return usageSeries.series;
  const series = await optional("/v1/usage/history");
  usageSeries = { at: Date.now(), series };
  return series;
}

async function renderCluster(view) {
  const [nodes, active, pending, fold, queues, series] = await Promise.all([
    api("/v1/nodes"), api(`/v1/jobs?state=${ACTIVE}&limit=10000`),
    api("/v1/jobs?state=pending&limit=10000"), api("/v1/state"), optional("/v1/queues"), usageHistory(),
  ]);
  const owners = gpuOwners(active.jobs);
  // a team token lists only its own jobs: the GPUs the others hold are busy with no owner here
  const othersBusy = nodes.nodes.some((n) => (n.busy_gpus || []).some((g) => !owners.has(`${n.node_id}/${g}`)));
  const teams = [...new Set(active.jobs.map((j) => j.team))].sort();
  knowTeams([...teams, ...pending.jobs.map((j) => j.team)]);
  const plans = drainPlans(nodes.nodes, active.jobs);
  const nodesById = new Map(nodes.nodes.map((n) => [n.node_id, n]));
  const total = nodes.nodes.reduce((sum, n) => sum + n.gpus.total, 0);
  const free = nodes.nodes.reduce((sum, n) => sum + n.gpus.free, 0);
  const { table } = teamTable(active.jobs, pending.jobs, queues);
  const since = series ? ` since ${clock(series.since)} UTC` : "";
  document.getElementById("status").textContent =
    `${nodes.nodes.length} nodes · ${total} GPUs · ${free} free · ${active.jobs.length} running · `
    + `${pending.jobs.length} waiting · log seq ${fold.seq}`;
  view.replaceChildren(el("div", { class: "panels" },
    el("div", {},
      el("div", { class: "panel" }, el("h2", {}, "Cluster"), legend(teams, othersBusy),
        heatMap(nodes.nodes, owners, plans)),
      el("div", { class: "panel" }, el("h2", {}, "Running jobs"), runningTable(active.jobs, plans, nodesById))),
    el("div", {},
      el("div", { class: "panel" }, el("h2", {}, "Queue"), queueTable(pending.jobs)),
      el("div", { class: "panel" }, el("h2", {}, "Teams"), table,
        el("h2", {}, `GPUs in use per team (from the log${since})`), usageChart(series, total)))));
}

// --- job page: details and timeline ---------------------------------------------------------------

const PHASE_COLORS = { pending: "#6b7785", bound: "#4aa3df", running: "#3fb27f", recovering: "#d08a2e" };

function milestones(job) {
  const marks = [["submitted", job.submitted_at, "pending"]];
  if (job.last_preempted_at) marks.push(["preempted", job.last_preempted_at, "pending"]);
  if (job.recovery && job.recovery.interrupted_at) marks.push(["interrupted", job.recovery.interrupted_at, "recovering"]);
  if (job.bound_at) marks.push(["bound", job.bound_at, "bound"]);
  if (job.started_at) marks.push([job.attempt > 1 ? "running (recovered)" : "running", job.started_at, "running"]);
  if (job.ended_at) marks.push([job.state, job.ended_at, null]);
  return marks.sort((a, b) => a[1] - b[1]);
}

// Event types of /v1/jobs/{id}/history -> (milestone label, the phase that follows it)
const HISTORY_MARKS = {
  JobSubmitted: ["submitted", "pending"], GangBound: ["bound", "bound"], JobStarted: ["running", "running"],
  JobPreempted: ["preempted", "pending"], JobInterrupted: ["interrupted", "recovering"],
  GangRepaired: ["recovered", "bound"], JobRequeued: ["requeued", "pending"],
  JobAttemptFailed: ["attempt failed", "pending"], JobCompleted: ["completed", null],
  JobFailed: ["failed", null], JobCancelled: ["cancelled", null],
};

function historyMilestones(history) {
  const marks = [];
  let recovered = false;
  for (const entry of history.timeline) {
    const mark = HISTORY_MARKS[entry.type.replace(/\.v\d+$/, "")];
    if (!mark || !entry.applied || entry.at === null) continue;
    let [label, phase] = mark;
    if (label === "recovered" || label === "interrupted") recovered = true;
    if (label === "running" && recovered) label = "running (recovered)";
    marks.push([label, entry.at, phase]);
  }
  return marks;
}

function timelineMarks(job, history) {
  const fromHistory = history && history.timeline ? historyMilestones(history) : [];
  return fromHistory.length ? fromHistory : milestones(job);
}

// What ends a run early: the span from one of these to the next "running" is the time the job was
// interrupted (not running, through no choice of its own), marked on the timeline with how long it lasted.
const INTERRUPTIONS = new Set(["interrupted", "preempted", "attempt failed"]);

function interruptedSpans(marks, end) {
  const spans = [];
  let open = null;
  for (const [label, t] of marks) {
    if (INTERRUPTIONS.has(label) && !open) open = { label, from: t };
    else if (label.startsWith("running") && open) { spans.push({ ...open, to: t }); open = null; }
  }
  if (open) spans.push({ ...open, to: end });
  return spans;
}

const LABEL_FONT = "11px system-ui, sans-serif";
let measurer = null;

function textWidth(text) {
  measurer = measurer || document.createElement("canvas").getContext("2d");
  measurer.font = LABEL_FONT;
  return measurer.measureText(text).width;
}

// Lay labels out in lanes so none overlaps another: each label goes, in time order, to the first lane
// whose last label ends (with a gap) before it starts; lanes alternate above and below the bar, nearest
// first. Each label is centred on its time, pushed inside the picture at the edges.
function laneLayout(items, width) {
  const gap = 8, lanes = [];
  for (const item of [...items].sort((a, b) => a.x - b.x)) {
    const half = item.width / 2;
    item.left = Math.min(Math.max(item.x - half, 2), width - 2 - item.width);
    let lane = lanes.findIndex((right) => right + gap <= item.left);
    if (lane < 0) { lane = lanes.length; lanes.push(0); }
    lanes[lane] = item.left + item.width;
    item.lane = lane;
  }
  return lanes.length;
}

function timeline(job, history) {
  const marks = timelineMarks(job, history);
  const width = 760, pad = 40, laneHeight = 30, barHeight = 14;
  const end = job.ended_at || Date.now() / 1000;
  const t0 = marks[0][1], span = Math.max(1e-3, end - t0);
  const x = (t) => pad + ((t - t0) / span) * (width - 2 * pad);
  const spans = interruptedSpans(marks, end);
  const items = [
    ...marks.map(([label, t]) => ({ kind: "milestone", label, t, x: x(t), lines: [label, `+${duration(t - t0)}`] })),
    ...spans.map((s) => ({ kind: "interrupted", label: s.label, t: s.from, x: (x(s.from) + x(s.to)) / 2,
      lines: [`${s.label}: not running`, `for ${duration(s.to - s.from)}`] })),
  ];
  for (const item of items) item.width = Math.max(...item.lines.map(textWidth)) + 4;
  const lanes = laneLayout(items, width);
  const above = Math.ceil(lanes / 2), below = Math.floor(lanes / 2);
  const barTop = above * laneHeight + 8, barBottom = barTop + barHeight;
  const height = barBottom + 8 + below * laneHeight + 4;
  const picture = svg("svg", { id: "timeline", class: "fit", width, height, viewBox: `0 0 ${width} ${height}` });
  marks.forEach(([, t, phase], i) => {
    const next = i + 1 < marks.length ? marks[i + 1][1] : end;
    if (!phase) return;
    picture.append(svg("rect", { class: "phase", "data-phase": phase, x: x(t), y: barTop, height: barHeight,
      width: Math.max(1, x(next) - x(t)), fill: PHASE_COLORS[phase] }, title(`${phase}: ${duration(next - t)}`)));
  });
  for (const s of spans) {
    picture.append(svg("rect", { class: "interrupted", "data-label": s.label, "data-seconds": s.to - s.from,
      x: x(s.from), y: barTop - 3, width: Math.max(2, x(s.to) - x(s.from)), height: barHeight + 6,
      fill: "url(#interrupted-hatch)", stroke: "var(--unhealthy)" }, title(`${s.label}: not running for ${duration(s.to - s.from)}`)));
  }
  picture.prepend(svg("defs", {}, svg("pattern", { id: "interrupted-hatch", width: 6, height: 6,
    patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" },
  svg("rect", { width: 6, height: 6, fill: "rgba(210,66,60,0.25)" }),
  svg("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "var(--unhealthy)", "stroke-width": 2 }))));
  for (const item of items) picture.append(timelineLabel(item, { barTop, barBottom, laneHeight }));
  return picture;
}

function timelineLabel(item, geometry) {
  const { barTop, barBottom, laneHeight } = geometry;
  const up = item.lane % 2 === 0, row = Math.floor(item.lane / 2);
  // the label's two lines: above the bar the first line sits higher, below it lower
  const first = up ? barTop - 8 - row * laneHeight - 14 : barBottom + 8 + row * laneHeight + 11;
  const cx = item.left + item.width / 2;
  const group = svg("g", { class: item.kind === "milestone" ? "milestone" : "interrupted-label",
    "data-label": item.label, "data-lane": item.lane });
  // a tick across the bar at the label's time; the label sits in its lane, centred on that time
  group.append(svg("line", { x1: item.x, y1: barTop - 5, x2: item.x, y2: barBottom + 5,
    stroke: item.kind === "milestone" ? "var(--text)" : "var(--unhealthy)" }),
  svg("text", { x: cx, y: first, "text-anchor": "middle", class: item.kind === "milestone" ? "" : "warn" }, item.lines[0]),
  svg("text", { x: cx, y: first + 13, "text-anchor": "middle", class: "label" }, item.lines[1]));
  return group;
}

function details(job) {
  const rows = [["state", job.state], ["team", job.team], ["priority", job.priority], ["GPUs", String(job.gpus)],
    ["attempt", String(job.attempt)], ["nodes", job.nodes.join(", ") || "—"],
    ["pending reason", job.pending_reason ? `${job.pending_reason.code}: ${job.pending_reason.message}` : "—"],
    ["depends on", dependencies(job)],
    ["queue position", job.queue_position === null ? "—" : String(job.queue_position)],
    ["predicted start", startText(job.predicted_start, Date.now() / 1000)],
    ["submitted", when(job.submitted_at)], ["bound", when(job.bound_at)], ["started", when(job.started_at)],
    ["ended", when(job.ended_at)], ["preemptions", String(job.preemptions)],
    ["infra failures", String(job.recovery.infra_failures)], ["lost GPU-seconds", job.recovery.lost_gpu_s.toFixed(1)],
    ["drain", job.drain ? drainText(job.drain) : "—"], ["command", job.spec.command.join(" ")]];
  return el("dl", { class: "kv" }, ...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

// The jobs this one waits for (docs/api.md "Dependencies"), each a link to its page: the chain is followed
// page by page; another team's job is shown as the API redacts it, without a link.
function dependencies(job) {
  const deps = job.depends_on || [];
  if (!deps.length) return job.singleton ? "singleton (one of its name at a time)" : "—";
  const items = deps.flatMap((d, i) => [i ? ", " : "", `${d.kind} `,
    /^[A-Za-z0-9_-]+$/.test(d.job_id) ? link(`#/job/${d.job_id}`, d.job_id) : d.job_id]);
  return el("span", { class: "depends-on" }, ...items, job.singleton ? "; singleton" : "");
}

function eventTable(history) {
  if (!history || !history.timeline) return el("p", { class: "muted" }, "no event history from this API");
  const t0 = history.submitted_at;
  return el("table", { id: "events" }, el("tr", {}, ...["seq", "time", "event", ""].map((h) => el("th", {}, h))),
    ...history.timeline.map((e) => el("tr", { class: "event-row" }, el("td", {}, String(e.seq)),
      el("td", {}, e.at === null ? "—" : `+${duration(e.at - t0)}`), el("td", {}, e.type),
      el("td", { class: "muted" }, e.applied ? "" : "refused by the fold"))));
}

const shownRank = new Map(); // job -> the rank whose log the page shows

async function rankLog(job) {
  const rank = shownRank.get(job.job_id) || 0;
  const base = `/v1/jobs/${encodeURIComponent(job.job_id)}/logs?rank=${rank}`;
  let chunk = await optional(base);
  if (chunk && chunk.size > chunk.next_offset) chunk = (await optional(`${base}&offset=${Math.max(0, chunk.size - 16384)}`)) || chunk;
  const ranks = Math.min(job.world_size || 1, 16);
  const pick = el("div", {}, ...Array.from({ length: ranks }, (_, r) => {
    const button = el("button", { "data-rank": r, disabled: r === rank ? "" : null }, `rank ${r}`);
    button.addEventListener("click", () => { shownRank.set(job.job_id, r); render(); });
    return button;
  }));
  const text = chunk ? (chunk.text || "(empty so far)") : "no log: the job has not been placed, or its agent does not answer";
  return el("div", {}, pick, el("pre", { id: "rank-log", style: "max-height:300px;overflow:auto" }, text));
}

async function renderJob(view, jobId) {
  const job = await api(`/v1/jobs/${encodeURIComponent(jobId)}`);
  const history = await optional(`/v1/jobs/${encodeURIComponent(jobId)}/history`);
  document.getElementById("status").textContent = `job ${job.name} · ${job.state}`;
  const attempts = job.recovery.attempts.length
    ? el("ul", {}, ...job.recovery.attempts.map((a) => el("li", {}, a))) : el("p", { class: "muted" }, "none");
  const placement = el("table", {}, el("tr", {}, el("th", {}, "task"), el("th", {}, "node"), el("th", {}, "GPUs")),
    ...job.allocation.map((t) => el("tr", {}, el("td", {}, String(t.task)), el("td", {}, t.node_id),
      el("td", {}, t.gpus.join(", ")))));
  view.replaceChildren(el("div", { class: "panel", id: "job", "data-job": job.job_id, "data-state": job.state },
    el("h2", {}, `Job ${job.name} `, el("span", { class: "state" }, job.state)),
    el("h2", {}, "Timeline"), timeline(job, history),
    el("div", { class: "panels" }, el("div", {}, el("h2", {}, "Details"), details(job)),
      el("div", {}, el("h2", {}, "Placement"), placement, el("h2", {}, "Failed attempts"), attempts)),
    el("h2", {}, "Rank logs"), await rankLog(job),
    el("h2", {}, "Events"), eventTable(history)));
}

// --- history: queue time and JCT of finished jobs, and the finished jobs themselves ---------------

// A histogram with its axes: bins of equal width from 0 to the largest value, a count over each bar, the
// count axis (0 and the tallest bin) and the value axis (bin edges, every other one), each with its title.
function histogram(id, label, values) {
  const width = 440, height = 200, left = 40, right = 12, top = 16, bottom = 44, bins = 10;
  const picture = svg("svg", { id, width, height, viewBox: `0 0 ${width} ${height}`, class: "histogram fit",
    "data-values": values.length });
  if (!values.length) {
    picture.append(svg("text", { x: left, y: 30, class: "label" }, "no finished jobs yet"));
    return picture;
  }
  const max = Math.max(...values, 1e-3);
  const counts = new Array(bins).fill(0);
  for (const v of values) counts[Math.min(bins - 1, Math.floor((v / max) * bins))] += 1;
  const tallest = Math.max(...counts);
  const plotWidth = width - left - right, plotHeight = height - top - bottom;
  const barWidth = plotWidth / bins, base = height - bottom;
  counts.forEach((count, i) => {
    const h = (count / tallest) * plotHeight, x = left + i * barWidth;
    picture.append(svg("rect", { class: "bar", "data-count": count, x: x + 1, y: base - h,
      width: barWidth - 2, height: h, fill: "var(--accent)" },
    title(`${count} jobs in ${duration((i / bins) * max)} … ${duration(((i + 1) / bins) * max)}`)));
    if (count) picture.append(svg("text", { x: x + barWidth / 2, y: base - h - 3, "text-anchor": "middle",
      class: "count" }, String(count)));
  });
  picture.append(svg("line", { class: "axis", x1: left, y1: base, x2: width - right, y2: base }),
    svg("line", { class: "axis", x1: left, y1: base, x2: left, y2: top }));
  for (const v of [0, tallest]) {
    picture.append(svg("text", { x: left - 5, y: base - (v / tallest) * plotHeight + 4, "text-anchor": "end",
      class: "label tick" }, String(v)));
  }
  for (let i = 0; i <= bins; i += 2) {
    picture.append(svg("text", { x: left + i * barWidth, y: base + 14, "text-anchor": "middle",
      class: "label tick" }, duration((i / bins) * max)));
  }
  picture.append(svg("text", { x: 12, y: top + plotHeight / 2, class: "label axis-title", "text-anchor": "middle",
    transform: `rotate(-90 12 ${top + plotHeight / 2})` }, "jobs"),
  svg("text", { x: left + plotWidth / 2, y: height - 6, class: "label axis-title", "text-anchor": "middle" }, label));
  return picture;
}

const FINISHED_SHOWN = 200; // rows of the finished-jobs table; the histograms use every job /v1/history gave

function finishedTable(jobs) {
  const newest = [...jobs].sort((a, b) => (b.ended_at ?? 0) - (a.ended_at ?? 0)).slice(0, FINISHED_SHOWN);
  const table = el("table", { id: "finished" }, el("tr", {}, ...["job", "team", "state", "GPUs", "waited",
    "ran", "GPU-hours", "attempts", "preemptions", "ended"].map((h) => el("th", {}, h))));
  for (const job of newest) {
    table.append(el("tr", { class: "finished-row", "data-job": job.job_id, "data-state": job.state },
      el("td", {}, link(`#/job/${job.job_id}`, job.name)), el("td", {}, swatch(job.team), " ", job.team),
      el("td", {}, job.state), el("td", {}, String(job.gpus)), el("td", {}, duration(job.queue_s)),
      el("td", {}, duration(job.run_s)), el("td", {}, job.gpu_hours.toFixed(3)), el("td", {}, String(job.attempts)),
      el("td", {}, String(job.preemptions)), el("td", {}, when(job.ended_at))));
  }
  if (!newest.length) table.append(el("tr", {}, el("td", { colspan: 10, class: "muted" }, "no finished jobs yet")));
  return table;
}

async function renderHistory(view) {
  const finished = await api("/v1/history?limit=10000");
  const jobs = finished.jobs.filter((j) => j.ended_at);
  const jct = jobs.map((j) => j.ended_at - j.submitted_at);
  const older = finished.total > finished.count ? ` (the newest ${finished.count} of ${finished.total})` : "";
  document.getElementById("status").textContent = `${finished.total} finished jobs`;
  view.replaceChildren(el("div", { class: "panels" },
    el("div", { class: "panel" }, el("h2", {}, `Time waiting in the queue${older}`),
      histogram("queue-time", "waiting before and between attempts", jobs.map((j) => j.queue_s))),
    el("div", { class: "panel" }, el("h2", {}, `Job completion time${older}`),
      histogram("jct", "submission to end", jct))),
  el("div", { class: "panel" }, el("h2", {}, `Finished jobs, newest first${jobs.length > FINISHED_SHOWN
    ? ` (${FINISHED_SHOWN} shown)` : ""}`), finishedTable(jobs)));
}

// --- router -------------------------------------------------------------------------------------

async function render() {
  const view = document.getElementById("view");
  const route = location.hash.replace(/^#\/?/, "");
  staleSeq = null;
  try {
    await loadTeams();
    if (route.startsWith("job/")) await renderJob(view, decodeURIComponent(route.slice(4)));
    else if (route === "history") await renderHistory(view);
    else await renderCluster(view);
    document.getElementById("login").hidden = true;
    document.body.dataset.rendered = route || "cluster";
  } catch (error) {
    if (error instanceof Unauthorized) showLogin(localStorage.getItem(TOKEN_KEY) ? refusedTokenMessage(error) : "");
    else document.getElementById("status").textContent = `error: ${error.message}`;
  }
  showStale(); // gone again once every read of this render was answered normally
}

function start() {
  takeTokenFromUrl();
  document.getElementById("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    localStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
    render();
  });
  document.getElementById("forget").addEventListener("click", () => { localStorage.removeItem(TOKEN_KEY); showLogin(""); });
  window.addEventListener("hashchange", render);
  render();
  clearInterval(timer);
  timer = setInterval(render, REFRESH_MS);
}

start();
