// The Agent-Reach admin page. Plain JavaScript, no build step, no dependency.
//
// Everything shown comes from agents and callers (ids, names, tasks, reasons), so the DOM is
// built with createElement and textContent only: no markup is ever parsed from data.
// The admin token lives in sessionStorage (this tab only), never in a URL or a cookie, and is
// sent as a Bearer header on every call.
"use strict";

(() => {
  const TOKEN_KEY = "reach.adminToken";
  const TRAFFIC_MS = 1000; // the live tail: a new request shows within about a second
  const STATE_MS = 2000; // agents and the Router's own state
  const TAIL_ROWS = 100;
  const NS = "http://www.w3.org/2000/svg";

  const $ = (id) => document.getElementById(id);
  const AGENT_CLASS = { available: "ok", suspect: "warn", unhealthy: "bad", offline: "off" };
  const BREAKER_CLASS = { closed: "ok", half_open: "warn", open: "bad" };
  const STATUS_COLOR = {
    SUCCESS: "#38a169",
    ACCEPTED: "#4299e1",
    AGENT_ERROR: "#e53e3e",
    TIMEOUT: "#dd6b20",
    NO_AVAILABLE_HANDLER: "#805ad5",
    OVERLOADED: "#d69e2e",
    INVALID_REQUEST: "#718096",
    CONTEXT_UNAVAILABLE: "#b83280",
    UNAUTHORIZED: "#2c5282",
    FORBIDDEN: "#2a4365",
    INTERNAL_ERROR: "#742a2a",
  };
  const FALLBACK_COLORS = ["#319795", "#975a16", "#553c9a", "#9b2c2c"];

  class Refused extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  // -- DOM helpers: text only ---------------------------------------------------------------

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(NS, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
    return node;
  }

  function pill(text, cls) {
    return el("span", "pill " + (cls || ""), text);
  }

  function statusClass(status) {
    if (status === "SUCCESS" || status === "ACCEPTED") return "status-ok";
    if (status === "OVERLOADED" || status === "INVALID_REQUEST") return "status-warn";
    return status ? "status-bad" : "";
  }

  function kv(pairs) {
    const dl = el("dl", "kv");
    for (const [key, value] of pairs) {
      if (value === undefined || value === null || value === "") continue;
      dl.append(el("dt", "", key), el("dd", "", value));
    }
    return dl;
  }

  function ms(value) {
    if (value === null || value === undefined) return "–";
    return value >= 100 ? value.toFixed(0) : value.toFixed(1);
  }

  // Scores and factors are floats: three significant digits are what a person compares.
  function num(value) {
    if (typeof value !== "number" || !Number.isFinite(value) || Number.isInteger(value)) return value;
    return Math.abs(value) >= 100 ? value.toFixed(0) : String(Number(value.toPrecision(3)));
  }

  function ago(seconds) {
    if (!Number.isFinite(seconds)) return "–";
    if (seconds < 90) return Math.max(0, seconds).toFixed(0) + " s";
    if (seconds < 5400) return (seconds / 60).toFixed(0) + " min";
    return (seconds / 3600).toFixed(1) + " h";
  }

  function clockTime(iso) {
    const at = new Date(iso);
    if (Number.isNaN(at.getTime())) return "–";
    const pad = (n, w) => String(n).padStart(w || 2, "0");
    return pad(at.getHours()) + ":" + pad(at.getMinutes()) + ":" + pad(at.getSeconds()) + "." +
      pad(at.getMilliseconds(), 3);
  }

  // -- talking to the Router ----------------------------------------------------------------

  let serverOffsetMs = 0; // server clock minus this browser's, from /admin/summary's "now"
  const serverNow = () => Date.now() + serverOffsetMs;

  async function api(path) {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    // Relative to /admin/ui: "agents" is /admin/agents, whatever prefix a proxy adds.
    const resp = await fetch(path, {
      headers,
      cache: "no-store",
      credentials: "omit",
      redirect: "error",
      signal: AbortSignal.timeout(8000),
    });
    let body = null;
    try {
      body = await resp.json();
    } catch (err) {
      body = null;
    }
    const message = body && body.error && typeof body.error.message === "string" ? body.error.message : "";
    if (resp.status === 401 || resp.status === 403) throw new Refused(resp.status, message);
    if (!resp.ok) throw new Error(path + ": HTTP " + resp.status + (message ? ": " + message : ""));
    return body;
  }

  // -- auth ---------------------------------------------------------------------------------

  let generation = 0; // bumped to stop the polling loops of a refused or replaced token

  function showLogin(refusal) {
    generation += 1;
    $("main").hidden = true;
    $("login").hidden = false;
    $("forget-token").hidden = true;
    const error = $("login-error");
    error.hidden = !refusal;
    error.textContent = refusal || "";
    $("token").focus();
  }

  function refusalText(err, hadToken) {
    if (err.status === 403) {
      return "Refused: this token may not read the admin API" + (err.message ? " (" + err.message + ")" : "") +
        ". Use an admin token.";
    }
    if (hadToken) return "Refused: the Router does not know this token.";
    return "";
  }

  async function connect() {
    const hadToken = sessionStorage.getItem(TOKEN_KEY) !== null;
    try {
      renderSummary(await api("summary"));
    } catch (err) {
      if (err instanceof Refused) {
        sessionStorage.removeItem(TOKEN_KEY);
        showLogin(refusalText(err, hadToken));
      } else {
        setConn(false, err.message);
        setTimeout(connect, STATE_MS);
      }
      return;
    }
    $("login").hidden = true;
    $("main").hidden = false;
    $("forget-token").hidden = !hadToken;
    generation += 1;
    const mine = generation;
    poll(mine, tickTraffic, TRAFFIC_MS);
    poll(mine, tickState, STATE_MS);
    openLinkedTrace();
  }

  function openLinkedTrace() {
    const match = /^#trace=(.+)$/.exec(location.hash);
    if (!match) return;
    let traceId;
    try {
      traceId = decodeURIComponent(match[1]);
    } catch (err) {
      return; // not a trace id this page wrote
    }
    if (traceId !== selectedTrace) openTrace(traceId);
  }

  async function poll(mine, tick, everyMs) {
    while (mine === generation) {
      try {
        await tick();
        setConn(true);
      } catch (err) {
        if (mine !== generation) return;
        if (err instanceof Refused) {
          // The token was removed or the Router's policy changed under us.
          const hadToken = sessionStorage.getItem(TOKEN_KEY) !== null;
          sessionStorage.removeItem(TOKEN_KEY);
          showLogin(refusalText(err, hadToken));
          return;
        }
        setConn(false, err.message);
      }
      await new Promise((resolve) => setTimeout(resolve, everyMs));
    }
  }

  function setConn(ok, message) {
    const conn = $("conn");
    conn.className = ok ? "conn" : "conn bad";
    conn.textContent = ok ? "live · " + clockTime(new Date().toISOString()) : "unreachable: " + (message || "");
  }

  // -- agents -------------------------------------------------------------------------------

  let agentRows = [];

  async function tickState() {
    const [summary, agents] = await Promise.all([api("summary"), api("agents")]);
    renderSummary(summary);
    agentRows = Array.isArray(agents) ? agents : [];
    renderAgents();
  }

  function renderAgents() {
    const filter = $("task-filter").value.trim().toLowerCase();
    const tasks = new Set();
    for (const agent of agentRows) for (const task of agent.capabilities || []) tasks.add(String(task));
    const options = [...tasks].sort().map((task) => {
      const option = el("option");
      option.value = task;
      return option;
    });
    $("task-list").replaceChildren(...options);
    const shown = agentRows.filter(
      (agent) => !filter || (agent.capabilities || []).some((task) => String(task).toLowerCase().includes(filter)),
    );
    $("agent-table").tBodies[0].replaceChildren(...shown.map(agentRow));
    $("agent-count").textContent = filter ? shown.length + " of " + agentRows.length : String(agentRows.length);
    $("agents-empty").hidden = agentRows.length > 0;
  }

  // In flight at the agent, "/ capacity" when it declares one, "+ n queued" when calls wait.
  function inflightText(agent, stats) {
    let text = String(agent.inflight ?? stats.inflight ?? 0);
    if (agent.capacity) text += " / " + agent.capacity;
    if (agent.queued) text += " + " + agent.queued + " queued";
    return text;
  }

  function agentRow(agent) {
    const tr = el("tr");
    tr.dataset.agent = String(agent.id);
    const who = el("td");
    who.append(el("span", "mono", agent.id));
    if (agent.display_name) who.append(el("span", "name", agent.display_name));
    const stats = agent.stats || {};
    const status = el("td");
    status.append(pill(agent.status, AGENT_CLASS[agent.status] || ""));
    status.dataset.status = String(agent.status);
    const breaker = el("td");
    breaker.append(pill(agent.circuit, BREAKER_CLASS[agent.circuit] || ""));
    const caps = el("td");
    for (const task of agent.capabilities || []) caps.append(el("span", "chip", task));
    for (const dup of agent.nearDuplicates || []) {
      // A capability worded like another token's: it could take that tenant's callers by meaning.
      const flag = pill((dup.refused ? "refused: " : "") + dup.task + " ≈ " + dup.of, "status-warn");
      flag.title = "near-duplicate of another token's task " + dup.of + " (cosine " + dup.similarity + ")";
      flag.dataset.duplicate = String(dup.task);
      caps.append(flag);
    }
    const success = stats.requests ? (stats.successRate * 100).toFixed(1) + " %" : "–";
    const heartbeat = Date.parse(agent.lastHeartbeat);
    const lease = agent.managed ? "managed" : ago((serverNow() - heartbeat) / 1000);
    tr.append(
      who,
      status,
      breaker,
      el("td", "num", success),
      el("td", "num", stats.p50LatencyMs === null || stats.p50LatencyMs === undefined ? "–" : ms(stats.p50LatencyMs) + " ms"),
      el("td", "num", inflightText(agent, stats)),
      caps,
      el("td", "num", lease),
    );
    return tr;
  }

  // -- live traffic -------------------------------------------------------------------------

  let paused = false;
  let tailSignature = "";
  let selectedTrace = null;

  async function tickTraffic() {
    if (paused) return;
    const rows = await api("traces?limit=" + TAIL_ROWS);
    if (paused || !Array.isArray(rows)) return;
    const signature = rows.map((r) => r.traceId + "@" + r.startedAt + "@" + r.task).join("|");
    $("traffic-state").textContent = rows.length + " shown";
    if (signature === tailSignature) return; // nothing new: leave the rows (and a click) alone
    tailSignature = signature;
    $("traffic-table").tBodies[0].replaceChildren(...rows.map(trafficRow));
  }

  function trafficRow(hop) {
    const tr = el("tr");
    tr.dataset.trace = String(hop.traceId);
    if (hop.traceId === selectedTrace) tr.classList.add("selected");
    tr.append(
      el("td", "mono", clockTime(hop.startedAt)),
      shortId(hop.traceId),
      cutCell(hop.task),
      cutCell(hop.handlerAgentId || "–"),
      titled(el("td", statusClass(hop.status), hop.status || "–")),
      el("td", "num", ms(hop.durationMs)),
    );
    tr.addEventListener("click", () => openTrace(String(hop.traceId)));
    return tr;
  }

  function titled(cell) {
    cell.title = cell.textContent;
    return cell;
  }

  function cutCell(text) {
    const cell = el("td", "cut", text);
    cell.title = String(text);
    return cell;
  }

  function shortId(traceId) {
    // Trace ids run to 128 characters: the tail shows the start, the tooltip and the trace view all of it.
    const text = String(traceId);
    const cell = el("td", "mono", text.length > 18 ? text.slice(0, 17) + "…" : text);
    cell.title = text;
    return cell;
  }

  function togglePause() {
    paused = !paused;
    const button = $("pause");
    button.textContent = paused ? "Resume" : "Pause";
    button.setAttribute("aria-pressed", paused ? "true" : "false");
    $("traffic-state").textContent = paused ? "paused" : "";
  }

  // -- one trace ----------------------------------------------------------------------------

  async function openTrace(traceId) {
    selectedTrace = traceId;
    // The address names the trace open, so it can be shared: /admin/ui#trace=<traceId>.
    const hash = "#trace=" + encodeURIComponent(traceId);
    if (location.hash !== hash) history.replaceState(null, "", hash);
    for (const row of $("traffic-table").tBodies[0].rows) {
      row.classList.toggle("selected", row.dataset.trace === traceId);
    }
    $("trace-id").textContent = traceId;
    const body = $("trace-body");
    delete body.dataset.trace;
    body.replaceChildren(el("p", "muted", "loading…"));
    try {
      const trace = await api("traces/" + encodeURIComponent(traceId));
      if (selectedTrace === traceId) renderTrace(trace);
    } catch (err) {
      if (err instanceof Refused) {
        showLogin(refusalText(err, true));
        return;
      }
      if (selectedTrace === traceId) body.replaceChildren(el("p", "refusal", err.message));
    }
  }

  function hopOrder(trace) {
    const order = [];
    const walk = (nodes, depth) => {
      for (const node of nodes || []) {
        order.push({ index: node.hop, depth });
        walk(node.children, depth + 1);
      }
    };
    walk(trace.tree, 0);
    return order;
  }

  function renderTrace(trace) {
    const hops = trace.hops || [];
    const order = hopOrder(trace);
    const body = $("trace-body");
    body.dataset.trace = String(trace.traceId);
    body.replaceChildren(waterfall(hops, order));
    for (const { index, depth } of order) body.append(hopDetail(hops[index], depth));
  }

  function waterfall(hops, order) {
    const starts = hops.map((h) => Date.parse(h.startedAt));
    const t0 = Math.min(...starts);
    const t1 = Math.max(...hops.map((h, i) => starts[i] + (h.durationMs || 0)));
    const span = Math.max(t1 - t0, 1);
    const labelW = 290;
    const barW = 330;
    const rowH = 22;
    const height = order.length * rowH + 18;
    const chart = svg("svg", { class: "waterfall", viewBox: "0 0 " + (labelW + barW + 60) + " " + height });
    chart.append(svg("line", { class: "axis", x1: labelW, y1: 0, x2: labelW, y2: height }));
    order.forEach(({ index, depth }, row) => {
      const hop = hops[index];
      const y = row * rowH + 2;
      const x = labelW + ((starts[index] - t0) / span) * barW;
      const w = Math.max(2, ((hop.durationMs || 0) / span) * barW);
      const kind = hop.status === "SUCCESS" ? "bar-ok" : hop.status ? "bar-bad" : "bar-other";
      const bar = svg("rect", { class: kind, x, y, width: w, height: rowH - 6, rx: 2 });
      const tip = svg("title");
      tip.textContent = hop.task + " → " + (hop.handlerAgentId || "none") + ": " + hop.status + ", " + ms(hop.durationMs) + " ms";
      bar.append(tip);
      chart.append(bar);
      for (const attempt of hop.attempts || []) {
        const ax = x + ((attempt.offsetMs || 0) / span) * barW;
        const aw = Math.max(1.5, ((attempt.durationMs || 0) / span) * barW);
        const cls = attempt.outcome === "SUCCESS" ? "attempt" : "attempt failed";
        const mark = svg("rect", { class: cls, x: ax, y: y + rowH - 11, width: aw, height: 4 });
        const atip = svg("title");
        atip.textContent = "attempt " + attempt.agentId + ": " + attempt.outcome + ", " + ms(attempt.durationMs) + " ms";
        mark.append(atip);
        chart.append(mark);
      }
      if (hop.stream && hop.stream.chunks) chart.append(streamMarks(hop.stream, x, y + 1, span, barW, rowH));
      const label = svg("text", { x: 4 + depth * 14, y: y + 12 });
      const text = hop.task + " → " + (hop.handlerAgentId || "–");
      const room = 44 - depth * 2; // characters that fit beside the bars at this depth
      label.textContent = (depth ? "↳ " : "") + (text.length > room ? text.slice(0, room - 1) + "…" : text);
      const took = svg("text", { x: labelW + barW + 6, y: y + 12 });
      took.textContent = ms(hop.durationMs) + " ms";
      chart.append(label, took);
    });
    const scale = svg("text", { x: labelW + barW, y: height - 3, "text-anchor": "end" });
    scale.textContent = ms(span) + " ms";
    chart.append(scale);
    return chart;
  }

  // A streamed answer's chunks on its hop's bar: a tick at each chunk's time the trace kept (the
  // first ones), and one at the last chunk; the tooltip says how many came, and when.
  function streamMarks(stream, x, y, span, barW, rowH) {
    const group = svg("g", { class: "chunks", "data-chunks": String(stream.chunks) });
    const times = (stream.marksMs || []).slice();
    if (stream.lastChunkMs != null && times[times.length - 1] !== stream.lastChunkMs) times.push(stream.lastChunkMs);
    for (const at of times) {
      const cx = x + (at / span) * barW;
      group.append(svg("line", { class: "chunk", x1: cx, y1: y, x2: cx, y2: y + rowH - 12 }));
    }
    const tip = svg("title");
    tip.textContent =
      stream.chunks + " chunks, " + stream.bytes + " bytes: first at +" + ms(stream.firstChunkMs) +
      " ms, last at +" + ms(stream.lastChunkMs) + " ms" + (stream.ended ? ", ended " + stream.ended : "") +
      (times.length < stream.chunks ? " (" + times.length + " drawn)" : "");
    group.append(tip);
    return group;
  }

  function hopDetail(hop, depth) {
    const box = el("div", "hop");
    box.dataset.hop = String(hop.hop);
    const title = el("h3");
    title.append(
      el("span", "", "Hop " + hop.hop + (depth ? " (nested, depth " + depth + ")" : "") + ": "),
      el("span", "mono", hop.task),
      el("span", "", " from "),
      el("span", "mono", hop.source),
      el("span", "", " → "),
      el("span", statusClass(hop.status), hop.status || "–"),
      el("span", "muted", " " + ms(hop.durationMs) + " ms"),
    );
    const decision = hop.decision || {};
    box.append(
      title,
      kv([
        ["rule", decision.rule],
        ["strategy", decision.strategy],
        ["matched task", decision.matchedTask],
        ["selected", decision.selected],
        ["score", num(decision.score)],
        ["affinity", decision.affinity],
        ["mode", hop.mode],
        ["conversation", hop.conversationId],
        ["HTTP status", hop.httpStatus],
        ["error code", hop.errorCode],
        ["retries", (hop.retries || []).join(", ")],
        ["failovers", (hop.failovers || []).join(", ")],
        ["breakers opened", (hop.circuitTrips || []).join(", ")],
        ...(hop.stream
          ? [
              ["stream", hop.stream.chunks + " chunks, " + hop.stream.bytes + " bytes, ended " + (hop.stream.ended || "–")],
              ["first chunk", hop.stream.firstChunkMs == null ? "–" : "+" + ms(hop.stream.firstChunkMs) + " ms"],
              ["last chunk", hop.stream.lastChunkMs == null ? "–" : "+" + ms(hop.stream.lastChunkMs) + " ms"],
            ]
          : []),
        ["waited for a slot", hop.slotWaitMs ? ms(hop.slotWaitMs) + " ms" : null],
        ["waited for a connection", hop.poolWaitMs ? ms(hop.poolWaitMs) + " ms" : null],
      ]),
      candidatesTable(decision),
    );
    if (decision.semantic) {
      box.append(el("div", "muted", "semantic match"), el("pre", "", JSON.stringify(decision.semantic, null, 2)));
    }
    const attempts = hop.attempts || [];
    if (attempts.length) {
      const list = el("ol", "events");
      for (const a of attempts) {
        list.append(el("li", "", a.agentId + ": " + a.outcome + ", " + ms(a.durationMs) + " ms at +" + ms(a.offsetMs) + " ms"));
      }
      box.append(el("div", "muted", "attempts"), list);
    }
    const events = hop.events || [];
    if (events.length) {
      const list = el("ul", "events");
      for (const e of events) list.append(el("li", "", e.kind + ": " + e.text));
      box.append(el("div", "muted", "events"), list);
    }
    return box;
  }

  function candidatesTable(decision) {
    const factors = new Map();
    for (const row of decision.scores || []) factors.set(row.agentId, row);
    const rejected = new Map();
    for (const row of decision.rejected || []) rejected.set(row.agentId, row);
    const ids = [...(decision.candidates || [])];
    for (const id of [...rejected.keys(), ...factors.keys()]) if (!ids.includes(id)) ids.push(id);
    if (!ids.length) return el("p", "muted", "No candidate: no agent declared the task.");
    const table = el("table", "candidates");
    const head = el("tr");
    for (const name of ["Candidate", "Outcome", "Score", "Factors"]) head.append(el("th", "", name));
    table.append(el("thead"), el("tbody"));
    table.tHead.append(head);
    for (const id of ids) {
      const tr = el("tr");
      tr.dataset.candidate = String(id);
      const out = rejected.get(id);
      // Selected first, then declined (or failed): what it did outranks that it was picked.
      const chosen = id === decision.selected && !out;
      if (chosen) tr.classList.add("chosen");
      const outcome = out ? rejectedCell(out) : chosen ? el("td", "status-ok", "selected") : el("td", "muted", "not needed");
      const row = factors.get(id);
      // The match score when there is one (by meaning, or a rejection's), else the weighted share.
      let score = out && out.score !== undefined ? out.score : chosen ? decision.score : null;
      if ((score === null || score === undefined) && row && row.effective !== undefined) score = row.effective;
      const parts = row
        ? Object.entries(row).filter(([key]) => key !== "agentId").map(([key, value]) => key + " " + num(value)).join(" · ")
        : "";
      tr.append(el("td", "mono", id), outcome, el("td", "num", score === null || score === undefined ? "–" : num(score)), el("td", "", parts));
      table.tBodies[0].append(tr);
    }
    return table;
  }

  function rejectedCell(out) {
    // A decline's reason is the agent's own message: the one thing an operator wants to read here.
    const cell = el("td", "reason", out.reason);
    if (out.message) cell.append(el("span", "said", "“" + out.message + "”"));
    return cell;
  }

  // -- the Router itself --------------------------------------------------------------------

  let policyDigest = "";

  function renderSummary(summary) {
    serverOffsetMs = Date.parse(summary.now) - Date.now();
    const pills = [];
    pills.push(summary.ready ? pill("not ready: " + summary.ready, "bad") : pill("ready", "ok"));
    if (summary.registry.degraded) pills.push(pill("degraded: " + summary.registry.degraded, "bad"));
    if (summary.shedding.active) pills.push(pill("shedding load", "warn"));
    if (summary.embedding.up === false) pills.push(pill("embedder down", "bad"));
    if (summary.embedding.loading) pills.push(pill("embedder loading: routes by meaning wait", "warn"));
    pills.push(pill(summary.auth ? "auth on" : "auth off", summary.auth ? "ok" : "warn"));
    if (summary.worker !== null && summary.worker !== undefined) pills.push(pill("worker " + summary.worker, ""));
    pills.push(pill("v" + summary.version, "off"));
    $("router-state").replaceChildren(...pills);
    renderFacts(summary);
    renderPolicy(summary.policy);
    drawChart(summary.traffic);
  }

  function renderFacts(summary) {
    const traffic = summary.traffic;
    const total = Object.values(traffic.totals).reduce((a, b) => a + b, 0);
    const minute = recentRates(traffic, 60);
    const budget = summary.retryBudget;
    const shed = summary.shedding;
    const agents = Object.entries(summary.registry.agents).filter(([, n]) => n > 0).map(([s, n]) => n + " " + s);
    const reload = summary.policy.lastReload;
    const facts = [
      ["uptime", ago((Date.parse(summary.now) - Date.parse(summary.startedAt)) / 1000)],
      ["requests", total + (traffic.metricsEnabled ? "" : " (metrics off)")],
      ["last minute", minute.total.toFixed(2) + " req/s, " + (minute.errorShare * 100).toFixed(1) + " % not SUCCESS"],
      ["in flight", shed.inflight + " of " + shed.maxInflight],
      ["loop lag", shed.loopLagMs + " ms (sheds at " + shed.loopLagLimitMs + ")"],
      ["shed (OVERLOADED)", String(shed.overloadedTotal)],
      ["retry budget", budget.enabled ? budget.retries + " of " + budget.allowance.toFixed(0) + " retries used (" + budget.windowSeconds + " s)" : "off"],
      ["registry", summary.registry.backend + (summary.registry.degraded ? " (degraded)" : "")],
      ["agents", agents.join(", ") || "none"],
      ["policy loaded", clockTime(summary.policy.loadedAt)],
      ["last reload", reload ? clockTime(reload.at) + (reload.ok ? " ok" : " refused: " + (reload.error || "")) : "never"],
    ];
    const dl = $("router-facts");
    dl.replaceChildren();
    for (const [key, value] of facts) dl.append(el("dt", "", key), el("dd", "", value));
  }

  function renderPolicy(policy) {
    $("policy-line").textContent = (policy.path || "defaults (no policy file)") + " · " + policy.digest;
    if (policy.digest === policyDigest) return; // keep the reader's scroll position
    policyDigest = policy.digest;
    $("policy-json").textContent = JSON.stringify(policy.settings, null, 2);
  }

  function recentRates(traffic, seconds) {
    let count = 0;
    let errors = 0;
    let covered = 0;
    for (const point of traffic.points.slice().reverse()) {
      if (covered >= seconds) break;
      covered += point.seconds;
      for (const [status, n] of Object.entries(point.byStatus)) {
        count += n;
        if (status !== "SUCCESS" && status !== "ACCEPTED") errors += n;
      }
    }
    return { total: covered ? count / covered : 0, errorShare: count ? errors / count : 0 };
  }

  function recentRate(traffic, status, seconds) {
    let count = 0;
    let covered = 0;
    for (const point of traffic.points.slice().reverse()) {
      if (covered >= seconds) break;
      covered += point.seconds;
      count += point.byStatus[status] || 0;
    }
    return covered ? count / covered : 0;
  }

  function colorOf(status, index) {
    return STATUS_COLOR[status] || FALLBACK_COLORS[index % FALLBACK_COLORS.length];
  }

  function drawChart(traffic) {
    const canvas = $("chart");
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || 640;
    const height = canvas.clientHeight || 180;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    $("chart-span").textContent = String(Math.round(traffic.spanSeconds / 60));
    const statuses = new Set();
    for (const point of traffic.points) for (const status of Object.keys(point.byStatus)) statuses.add(status);
    const order = [...statuses].sort((a, b) => (a === "SUCCESS" ? -1 : b === "SUCCESS" ? 1 : a.localeCompare(b)));
    const end = serverNow();
    const start = end - traffic.spanSeconds * 1000;
    const left = 36;
    const plotW = width - left - 6;
    const plotH = height - 18;
    const rows = traffic.points.map((p) => ({
      at: Date.parse(p.at),
      rates: order.map((s) => (p.byStatus[s] || 0) / p.seconds),
    }));
    const peak = Math.max(1, ...rows.map((r) => r.rates.reduce((a, b) => a + b, 0)));
    const top = niceCeil(peak);
    const xOf = (t) => left + ((t - start) / (end - start)) * plotW;
    const yOf = (v) => 4 + plotH - (v / top) * plotH;
    ctx.strokeStyle = "#e2e5eb";
    ctx.fillStyle = "#6b7385";
    ctx.font = "11px system-ui, sans-serif";
    ctx.lineWidth = 1;
    for (const frac of [0, 0.5, 1]) {
      const y = yOf(top * frac);
      ctx.beginPath();
      ctx.moveTo(left, y);
      ctx.lineTo(width - 6, y);
      ctx.stroke();
      ctx.fillText(formatRate(top * frac), 2, y + 4);
    }
    ctx.fillText("−" + Math.round(traffic.spanSeconds / 60) + " min", left, height - 3);
    ctx.fillText("now", width - 28, height - 3);
    // Stacked areas, SUCCESS at the bottom: the height of the stack is the total rate.
    const base = rows.map(() => 0);
    order.forEach((status, k) => {
      if (!rows.length) return;
      ctx.beginPath();
      rows.forEach((r, i) => {
        const x = xOf(r.at);
        const y = yOf(base[i] + r.rates[k]);
        if (i === 0) ctx.moveTo(x, y);
        else ctx.lineTo(x, y);
      });
      for (let i = rows.length - 1; i >= 0; i--) ctx.lineTo(xOf(rows[i].at), yOf(base[i]));
      ctx.closePath();
      ctx.fillStyle = colorOf(status, k);
      ctx.globalAlpha = 0.75;
      ctx.fill();
      ctx.globalAlpha = 1;
      rows.forEach((r, i) => {
        base[i] += r.rates[k];
      });
    });
    const legend = order.map((status, k) => {
      const item = el("li");
      const swatch = el("span", "swatch");
      swatch.style.backgroundColor = colorOf(status, k); // CSSOM, not a style attribute: allowed by the CSP
      item.append(swatch, el("span", "", status + " " + formatRate(recentRate(traffic, status, 60)) + "/s"));
      return item;
    });
    if (legend.length) legend.push(el("li", "muted", "(per second, last minute)"));
    if (!legend.length) legend.push(el("li", "muted", traffic.metricsEnabled ? "no requests yet" : "metrics are off"));
    $("chart-legend").replaceChildren(...legend);
    $("chart-now").textContent = "updated " + clockTime(new Date(end).toISOString());
  }

  function niceCeil(value) {
    const power = Math.pow(10, Math.floor(Math.log10(value)));
    for (const step of [1, 2, 5, 10]) if (value <= step * power) return step * power;
    return 10 * power;
  }

  function formatRate(value) {
    return value >= 10 ? value.toFixed(0) : value >= 1 ? value.toFixed(1) : value.toFixed(2);
  }

  // -- wiring -------------------------------------------------------------------------------

  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault(); // the CSP forbids form submission anyway: the token never goes in a URL
    const input = $("token");
    const token = input.value.trim();
    input.value = "";
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("login-error").hidden = true;
    connect();
  });
  $("forget-token").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin("");
  });
  $("pause").addEventListener("click", togglePause);
  window.addEventListener("hashchange", openLinkedTrace);
  $("task-filter").addEventListener("input", renderAgents);
  connect();
})();
