// Rallypoint dashboard: plain JS + SVG over the public API (/v1/nodes, /v1/jobs, /v1/jobs/{id}, /v1/state).
// No build step, nothing from the internet. Routes: #/ (cluster), #/job/<id> (a job), #/history.
"use strict";

const TOKEN_KEY = "rallypoint.token";
const REFRESH_MS = 2000;
const ACTIVE = "bound,running,repairing";
const ENDED = "completed,failed,cancelled";
const SVG_NS = "http://www.w3.org/2000/svg";
const usage = []; // samples of GPUs held per team since the page opened: {t, teams: {team: gpus}}
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

class Unauthorized extends Error {}

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
  if (response.status === 401) throw new Unauthorized(path);
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
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

// Distinct colours handed to teams in the order the page first sees them (sorted within one refresh), so
// two teams on screen never look alike until there are more teams than colours.
// No oranges or reds among them: those mean draining and unhealthy.
const PALETTE = ["#4e9be6", "#a77be8", "#3fb27f", "#2ec4c4", "#d4d45a", "#e879c0", "#8c8cf0", "#7fbf5f",
  "#5fa8a8", "#b0b0b0"];
const teamColors = new Map();

function teamColor(team) {
  if (!teamColors.has(team)) teamColors.set(team, PALETTE[teamColors.size % PALETTE.length]);
  return teamColors.get(team);
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

function heatMap(nodes, owners) {
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
      group.append(svg("text", { x: 0, y: y + cell - 4, class: node.status === "up" ? "" : "label" },
        `${node.node_id}${status}`, title(`${node.node_id} ${node.gpu_type} ${node.status} ${node.status_reason || ""}`)));
      // GPUs held by a job this token may not see (another team's): busy, with no job named
      const busy = new Set(node.busy_gpus || []);
      for (let gpu = 0; gpu < node.gpus.total; gpu++) {
        const owner = owners.get(`${node.node_id}/${gpu}`);
        const unseen = !owner && busy.has(gpu);
        const state = NODE_COLORS[node.status] ? (node.status === "drained" ? "draining" : "unhealthy")
          : owner || unseen ? "busy" : "free";
        const fill = NODE_COLORS[node.status]
          || (owner ? teamColor(owner.team) : unseen ? "var(--other-team)" : "var(--free)");
        const rect = svg("rect", {
          class: "gpu", x: labelWidth + gpu * (cell + gap), y, width: cell, height: cell, rx: 3, fill,
          "data-node": node.node_id, "data-gpu": gpu, "data-state": state,
          "data-job": owner ? owner.job_id : null, "data-team": owner ? owner.team : null,
        }, title(owner ? `GPU ${gpu}: ${owner.name} (${owner.team}) ${owner.state}`
          : unseen ? `GPU ${gpu}: busy (another team's job)` : `GPU ${gpu}: ${state}`));
        if (owner) {
          rect.style.cursor = "pointer";
          rect.addEventListener("click", () => { location.hash = `#/job/${owner.job_id}`; });
        }
        group.append(rect);
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
    ...items.map(([label, color]) => el("span", {}, el("i", { style: `background:${color}` }), label)));
}

function queueTable(pending) {
  const rows = [...pending].sort((a, b) => (a.queue_position ?? 1e12) - (b.queue_position ?? 1e12)
    || a.submitted_seq - b.submitted_seq);
  const now = Date.now() / 1000;
  const table = el("table", { id: "queue" }, el("tr", {}, ...["#", "job", "team", "GPUs", "priority", "waiting",
    "reason"].map((h) => el("th", {}, h))));
  for (const job of rows) {
    const reason = job.pending_reason || {};
    table.append(el("tr", { class: "queue-row", "data-job": job.job_id },
      el("td", {}, job.queue_position === null ? "—" : String(job.queue_position)),
      el("td", {}, link(`#/job/${job.job_id}`, job.name)),
      el("td", {}, job.team), el("td", {}, String(job.gpus)), el("td", {}, job.priority),
      el("td", {}, duration(now - job.submitted_at)),
      el("td", {}, el("b", {}, reason.code || ""), " ", reason.message || "")));
  }
  if (!rows.length) table.append(el("tr", {}, el("td", { colspan: 7, class: "muted" }, "nothing waiting")));
  return table;
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
      el("td", {}, el("i", { style: `display:inline-block;width:10px;height:10px;background:${teamColor(team)}` }), " ", team),
      el("td", {}, String(t.held)), el("td", {}, quota === undefined || quota === null ? "—" : String(quota)),
      el("td", {}, String(t.running)),
      el("td", {}, String(t.pendingJobs)), el("td", {}, String(t.pendingGpus))));
  }
  return { table, held: Object.fromEntries([...teams].map(([team, t]) => [team, t.held])) };
}

function usageChart(samples, totalGpus) {
  const width = 520, height = 160, pad = 28;
  const chart = svg("svg", { id: "usage-chart", width, height });
  if (samples.length < 2) return chart;
  const t0 = samples[0].t, t1 = samples[samples.length - 1].t;
  const x = (t) => pad + ((t - t0) / Math.max(1, t1 - t0)) * (width - 2 * pad);
  const y = (v) => height - pad - (v / Math.max(1, totalGpus)) * (height - 2 * pad);
  chart.append(svg("line", { x1: pad, y1: y(0), x2: width - pad, y2: y(0), stroke: "var(--line)" }),
    svg("line", { x1: pad, y1: y(totalGpus), x2: width - pad, y2: y(totalGpus), stroke: "var(--line)", "stroke-dasharray": "3 3" }),
    svg("text", { x: 2, y: y(totalGpus) + 4, class: "label" }, String(totalGpus)),
    svg("text", { x: 2, y: y(0) + 4, class: "label" }, "0"));
  const teams = new Set(samples.flatMap((s) => Object.keys(s.teams)));
  for (const team of teams) {
    const points = samples.map((s) => `${x(s.t).toFixed(1)},${y(s.teams[team] || 0).toFixed(1)}`).join(" ");
    chart.append(svg("polyline", { points, fill: "none", stroke: teamColor(team), "stroke-width": 2 }, title(team)));
  }
  return chart;
}

async function renderCluster(view) {
  const [nodes, active, pending, fold, queues] = await Promise.all([
    api("/v1/nodes"), api(`/v1/jobs?state=${ACTIVE}&limit=10000`),
    api("/v1/jobs?state=pending&limit=10000"), api("/v1/state"), optional("/v1/queues"),
  ]);
  const owners = gpuOwners(active.jobs);
  // a team token lists only its own jobs: the GPUs the others hold are busy with no owner here
  const othersBusy = nodes.nodes.some((n) => (n.busy_gpus || []).some((g) => !owners.has(`${n.node_id}/${g}`)));
  const teams = [...new Set(active.jobs.map((j) => j.team))].sort();
  [...new Set([...teams, ...pending.jobs.map((j) => j.team)])].sort().forEach(teamColor);
  const total = nodes.nodes.reduce((sum, n) => sum + n.gpus.total, 0);
  const free = nodes.nodes.reduce((sum, n) => sum + n.gpus.free, 0);
  const { table, held } = teamTable(active.jobs, pending.jobs, queues);
  usage.push({ t: Date.now() / 1000, teams: held });
  if (usage.length > 600) usage.shift();
  document.getElementById("status").textContent =
    `${nodes.nodes.length} nodes · ${total} GPUs · ${free} free · ${pending.jobs.length} waiting · log seq ${fold.seq}`;
  view.replaceChildren(el("div", { class: "panels" },
    el("div", { class: "panel" }, el("h2", {}, "Cluster"), legend(teams, othersBusy), heatMap(nodes.nodes, owners)),
    el("div", {},
      el("div", { class: "panel" }, el("h2", {}, "Queue"), queueTable(pending.jobs)),
      el("div", { class: "panel" }, el("h2", {}, "Teams"), table,
        el("h2", {}, "GPUs held per team (since this page opened)"), usageChart(usage, total)))));
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

function timeline(job, history) {
  const fromHistory = history && history.timeline ? historyMilestones(history) : [];
  const marks = fromHistory.length ? fromHistory : milestones(job);
  const width = 760, height = 96, pad = 40;
  const end = job.ended_at || Date.now() / 1000;
  const t0 = marks[0][1], span = Math.max(1e-3, end - t0);
  const x = (t) => pad + ((t - t0) / span) * (width - 2 * pad);
  const picture = svg("svg", { id: "timeline", width, height });
  marks.forEach(([label, t, phase], i) => {
    const next = i + 1 < marks.length ? marks[i + 1][1] : end;
    if (phase) {
      picture.append(svg("rect", { class: "phase", "data-phase": phase, x: x(t), y: 40, height: 14,
        width: Math.max(1, x(next) - x(t)), fill: PHASE_COLORS[phase] }, title(`${phase}: ${duration(next - t)}`)));
    }
    const group = svg("g", { class: "milestone", "data-label": label });
    const above = i % 2 === 0; // alternate labels above and below the bar, so close milestones stay legible
    group.append(svg("line", { x1: x(t), y1: above ? 32 : 40, x2: x(t), y2: above ? 54 : 62, stroke: "var(--text)" }),
      svg("text", { x: x(t), y: above ? 14 : 76, "text-anchor": "middle" }, label),
      svg("text", { x: x(t), y: above ? 27 : 89, "text-anchor": "middle", class: "label" }, `+${duration(t - t0)}`));
    picture.append(group);
  });
  return picture;
}

function details(job) {
  const rows = [["state", job.state], ["team", job.team], ["priority", job.priority], ["GPUs", String(job.gpus)],
    ["attempt", String(job.attempt)], ["nodes", job.nodes.join(", ") || "—"],
    ["pending reason", job.pending_reason ? `${job.pending_reason.code}: ${job.pending_reason.message}` : "—"],
    ["queue position", job.queue_position === null ? "—" : String(job.queue_position)],
    ["submitted", when(job.submitted_at)], ["bound", when(job.bound_at)], ["started", when(job.started_at)],
    ["ended", when(job.ended_at)], ["preemptions", String(job.preemptions)],
    ["infra failures", String(job.recovery.infra_failures)], ["lost GPU-seconds", job.recovery.lost_gpu_s.toFixed(1)],
    ["command", job.spec.command.join(" ")]];
  return el("dl", { class: "kv" }, ...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
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

// --- history: queue time and JCT of finished jobs --------------------------------------------------

function histogram(id, label, values) {
  const width = 420, height = 150, pad = 26, bins = 10;
  const picture = svg("svg", { id, width, height });
  if (!values.length) return picture;
  const max = Math.max(...values, 1e-3);
  const counts = new Array(bins).fill(0);
  for (const v of values) counts[Math.min(bins - 1, Math.floor((v / max) * bins))] += 1;
  const top = Math.max(...counts);
  const barWidth = (width - 2 * pad) / bins;
  counts.forEach((count, i) => {
    const h = (count / top) * (height - 2 * pad);
    picture.append(svg("rect", { x: pad + i * barWidth + 1, y: height - pad - h, width: barWidth - 2, height: h,
      fill: "var(--accent)" }, title(`${count} jobs ≤ ${duration(((i + 1) / bins) * max)}`)));
  });
  picture.append(svg("text", { x: pad, y: height - 6, class: "label" }, `${label}: 0 … ${duration(max)}`));
  return picture;
}

async function renderHistory(view) {
  const ended = await api(`/v1/jobs?state=${ENDED}&limit=10000`);
  const jobs = ended.jobs.filter((j) => j.ended_at);
  const waits = jobs.filter((j) => j.bound_at).map((j) => j.bound_at - j.submitted_at);
  const jct = jobs.map((j) => j.ended_at - j.submitted_at);
  document.getElementById("status").textContent = `${jobs.length} finished jobs`;
  view.replaceChildren(el("div", { class: "panels" },
    el("div", { class: "panel" }, el("h2", {}, "Queue time (last attempt)"), histogram("queue-time", "wait", waits)),
    el("div", { class: "panel" }, el("h2", {}, "Job completion time"), histogram("jct", "JCT", jct))));
}

// --- router -------------------------------------------------------------------------------------

async function render() {
  const view = document.getElementById("view");
  const route = location.hash.replace(/^#\/?/, "");
  staleSeq = null;
  try {
    if (route.startsWith("job/")) await renderJob(view, decodeURIComponent(route.slice(4)));
    else if (route === "history") await renderHistory(view);
    else await renderCluster(view);
    document.getElementById("login").hidden = true;
    document.body.dataset.rendered = route || "cluster";
  } catch (error) {
    if (error instanceof Unauthorized) showLogin(localStorage.getItem(TOKEN_KEY) ? "the token was refused" : "");
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
