// The dpkit curator dashboard: plain JavaScript, no framework, no build step.
//
// It holds no data of its own: everything shown comes from the /v1 API with the API key the user
// types in (kept in sessionStorage only, for this tab). All server-provided text is put into the
// page with textContent / text nodes, never parsed as HTML: dataset and analyst names, query text
// and audit outcomes come from users.
"use strict";

(() => {
  const STORAGE_KEY = "dpkit.apiKey";
  const AUDIT_KEEP = 50;
  const HISTORY_KEEP = 200;
  const SVG_NS = "http://www.w3.org/2000/svg";

  const state = {
    key: null,
    me: null,
    datasets: [],
    budgets: [],
    busy: false,
  };

  // ---------------------------------------------------------------------------------------------
  // small helpers
  // ---------------------------------------------------------------------------------------------

  const $ = (id) => document.getElementById(id);

  /** An element; string children become text nodes (never HTML). */
  function h(tag, props, ...children) {
    return build(document.createElement(tag), props, children);
  }

  /** An SVG element, same conventions as h(). */
  function s(tag, props, ...children) {
    return build(document.createElementNS(SVG_NS, tag), props, children);
  }

  function build(el, props, children) {
    if (props) {
      for (const [name, value] of Object.entries(props)) {
        if (value === null || value === undefined || value === false) continue;
        if (name === "class") el.setAttribute("class", value);
        else if (name === "data") for (const [k, v] of Object.entries(value)) el.dataset[k] = String(v);
        else el.setAttribute(name, value === true ? "" : String(value));
      }
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  /** A number for people: at most `digits` significant digits, no float noise (0.19999… → 0.2). */
  function fmt(x, digits = 6) {
    if (x === null || x === undefined) return "—";
    if (typeof x !== "number") return String(x);
    if (!Number.isFinite(x)) return String(x);
    return String(Number(x.toPrecision(digits)));
  }

  function parseTime(iso) {
    if (typeof iso !== "string") return NaN;
    // Python's isoformat() has microseconds; keep milliseconds for Date.parse.
    return Date.parse(iso.replace(/(\.\d{3})\d+/, "$1"));
  }

  const pad = (n) => String(n).padStart(2, "0");

  function fmtTime(iso) {
    const t = parseTime(iso);
    if (Number.isNaN(t)) return iso === null || iso === undefined ? "—" : String(iso);
    const d = new Date(t);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function timeCell(iso) {
    return h("td", { class: "nowrap", title: iso }, fmtTime(iso));
  }

  function statusBadge(status) {
    const cls = status >= 500 ? "bad" : status >= 400 ? (status === 409 ? "warn" : "bad") : "ok";
    return h("span", { class: `badge status ${cls}` }, String(status));
  }

  function setNotice(el, content, kind) {
    if (!el) return;
    el.replaceChildren();
    if (content === null || content === undefined || content === "") {
      el.hidden = true;
      return;
    }
    if (kind) el.className = `notice ${kind}`;
    el.append(content instanceof Node ? content : document.createTextNode(String(content)));
    el.hidden = false;
  }

  function emptyRow(tbody, columns, text) {
    tbody.append(h("tr", { class: "empty" }, h("td", { colspan: columns }, text)));
  }

  function clamp01(x) {
    return Number.isFinite(x) ? Math.min(1, Math.max(0, x)) : 0;
  }

  /** A horizontal bar whose fill is `fraction` wide (the width is set through the CSSOM). */
  function bar(fraction, props) {
    const f = clamp01(fraction);
    const pct = Math.round(f * 10000) / 100;
    const level = f >= 0.5 ? "ok" : f >= 0.15 ? "warn" : "low";
    const fill = h("div", { class: `bar-fill budget-fill ${level}` });
    fill.style.width = `${pct}%`;
    return h(
      "div",
      {
        class: `bar ${props.class || ""}`.trim(),
        role: "progressbar",
        "aria-valuemin": 0,
        "aria-valuemax": 100,
        "aria-valuenow": pct,
        "aria-label": props.label,
        data: props.data,
      },
      fill,
    );
  }

  // ---------------------------------------------------------------------------------------------
  // the API
  // ---------------------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, code, message, body) {
      super(message);
      this.status = status;
      this.code = code;
      this.body = body || {};
    }
  }

  async function api(path, options = {}) {
    const headers = { Accept: "application/json", Authorization: `Bearer ${state.key}` };
    const init = { method: options.method || "GET", headers, cache: "no-store", credentials: "omit" };
    if (options.body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(options.body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (err) {
      throw new ApiError(0, "network", `the server could not be reached (${err.message})`);
    }
    const text = await response.text();
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch (err) {
        data = null;
      }
    }
    if (!response.ok) {
      const body = data && typeof data.error === "object" && data.error ? data.error : {};
      const message = typeof body.message === "string" ? body.message : `${response.status} ${response.statusText}`;
      const error = new ApiError(response.status, body.code || `http_${response.status}`, message, body);
      if (response.status === 401 && state.me && !options.login) {
        // The key was revoked while we were signed in.
        setTimeout(() => signOut(`Your key is no longer accepted (${message}). Sign in again.`), 0);
      }
      throw error;
    }
    if (data === null) throw new ApiError(response.status, "bad_response", "the server's answer is not JSON");
    return data;
  }

  const ERROR_TITLES = {
    budget_exceeded: "Budget exceeded",
    invalid_request: "Invalid request",
    not_found: "Not found",
    forbidden: "Not allowed",
    unauthenticated: "Not signed in",
    rate_limited: "Too many requests",
    too_large: "Request too large",
    ledger_unavailable: "Ledger unavailable",
    network: "Network error",
  };

  function describe(err) {
    if (!(err instanceof ApiError)) return `Unexpected error: ${err && err.message ? err.message : err}`;
    const title = ERROR_TITLES[err.code] || `Error ${err.status}`;
    return `${title}: ${err.message}`;
  }

  /** Run `task`; show its failure in the notice `errorId` (and clear that notice on success). */
  async function guarded(errorId, task) {
    try {
      await task();
      setNotice($(errorId), null);
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) return;
      setNotice($(errorId), describe(err), "error");
    }
  }

  /** The newest `keep` entries of /v1/audit or /v1/history, newest first. */
  async function loadNewest(path, keep) {
    const data = await api(`${path}?newest=true&limit=${keep}`);
    return Array.isArray(data.entries) ? data.entries : [];
  }

  // ---------------------------------------------------------------------------------------------
  // signing in and out
  // ---------------------------------------------------------------------------------------------

  function resetState() {
    state.me = null;
    state.datasets = [];
    state.budgets = [];
  }

  function clearViews() {
    for (const id of ["datasets", "analysts", "budgets", "audit", "history"]) {
      const table = $(id);
      if (table) table.tBodies[0].replaceChildren();
    }
    $("spending-chart").replaceChildren();
    $("budget-cards").replaceChildren();
    $("query-dataset").replaceChildren();
    $("query-result").replaceChildren();
    $("query-schema").replaceChildren();
    for (const id of ["query-error", "query-cost", "verify-result"]) setNotice($(id), null);
    for (const id of ["tile-datasets", "tile-analysts", "tile-keys", "tile-budgets", "tile-budgets-note"]) $(id).textContent = "";
  }

  async function signIn(key, { remembered = false } = {}) {
    state.key = key;
    const me = await api("/v1/me", { login: true });
    if (me.role !== "curator" && me.role !== "analyst") throw new ApiError(0, "bad_response", `unknown role ${me.role}`);
    try {
      sessionStorage.setItem(STORAGE_KEY, key);
    } catch (err) {
      /* storage disabled: the key lives in memory for this page only */
    }
    resetState();
    state.me = me;
    $("who-name").textContent = me.name;
    $("who-role").textContent = me.role;
    $("who-role").className = `badge role ${me.role}`;
    $("who-key").textContent = me.key_id ? `key ${me.key_id}` : "";
    $("whoami").hidden = false;
    $("login-view").hidden = true;
    $("curator-view").hidden = me.role !== "curator";
    $("analyst-view").hidden = me.role !== "analyst";
    document.title = `dpkit · ${me.name} (${me.role})`;
    if (!remembered) $("api-key").value = "";
    await refresh();
  }

  function signOut(message) {
    try {
      sessionStorage.removeItem(STORAGE_KEY);
    } catch (err) {
      /* nothing stored */
    }
    state.key = null;
    resetState();
    clearViews();
    $("whoami").hidden = true;
    $("curator-view").hidden = true;
    $("analyst-view").hidden = true;
    $("login-view").hidden = false;
    document.title = "dpkit curator";
    $("api-key").value = "";
    setNotice($("login-error"), message || null, "error");
    $("api-key").focus();
  }

  async function onLogin(event) {
    event.preventDefault();
    const key = $("api-key").value.trim();
    if (!key) {
      setNotice($("login-error"), "Enter your API key.", "error");
      return;
    }
    const button = $("login");
    button.disabled = true;
    setNotice($("login-error"), null);
    try {
      await signIn(key);
    } catch (err) {
      state.key = null;
      state.me = null;
      const text =
        err instanceof ApiError && err.status === 401
          ? `This key was not accepted: ${err.message}`
          : describe(err);
      setNotice($("login-error"), text, "error");
      $("api-key").select();
    } finally {
      button.disabled = false;
    }
  }

  async function refresh() {
    if (!state.me) return;
    const button = $("refresh");
    button.disabled = true;
    try {
      if (state.me.role === "curator") await loadCurator();
      else await loadAnalyst();
    } finally {
      button.disabled = false;
    }
  }

  // ---------------------------------------------------------------------------------------------
  // the curator's view
  // ---------------------------------------------------------------------------------------------

  async function loadCurator() {
    const budgetsAndSpending = guarded("budgets-error", async () => {
      const data = await api("/v1/budgets");
      renderBudgets(data.budgets || []);
    });
    await Promise.all([
      guarded("datasets-error", async () => renderDatasets((await api("/v1/datasets")).datasets || [])),
      guarded("analysts-error", async () => renderPrincipals((await api("/v1/analysts")).principals || [])),
      budgetsAndSpending,
      guarded("spending-error", async () => renderChart((await api("/v1/spending")).series || [])),
      guarded("audit-error", async () => {
        renderAudit(await loadNewest("/v1/audit", AUDIT_KEEP));
      }),
    ]);
  }

  function describeColumn(name, spec) {
    const type = spec && spec.type ? spec.type : "?";
    let detail = "";
    if (type === "numeric") detail = `[${fmt(spec.lower)}, ${fmt(spec.upper)}]`;
    else if (Array.isArray(spec.categories)) {
      const shown = spec.categories.slice(0, 8).map(String);
      detail = `{${shown.join(", ")}${spec.categories.length > 8 ? `, … ${spec.categories.length - 8} more` : ""}}`;
    }
    return h("span", { class: "chip" }, h("span", { class: "chip-name" }, name), ` ${type} ${detail}`.trimEnd());
  }

  function renderDatasets(datasets) {
    state.datasets = datasets;
    $("tile-datasets").textContent = String(datasets.length);
    const tbody = $("datasets").tBodies[0];
    tbody.replaceChildren();
    if (!datasets.length) return emptyRow(tbody, 6, "No datasets registered yet.");
    for (const d of datasets) {
      const cols = Object.entries(d.columns || {}).map(([name, spec]) => describeColumn(name, spec || {}));
      const bounds = [];
      if (d.max_groups !== undefined) bounds.push(`max_groups ${d.max_groups}`);
      if (d.max_rows !== undefined) bounds.push(`max_rows ${d.max_rows}`);
      tbody.append(
        h(
          "tr",
          { data: { dataset: d.name } },
          h("td", { class: "strong" }, d.name),
          h("td", null, h("div", { class: "chips" }, cols)),
          h("td", null, d.neighbours || "—"),
          h("td", null, d.privacy_unit ? h("code", null, String(d.privacy_unit)) : h("span", { class: "muted" }, "row"), bounds.length ? h("div", { class: "muted small" }, bounds.join(", ")) : null),
          h("td", { class: "path", title: d.source || "" }, d.source || "—"),
          timeCell(d.created_at),
        ),
      );
    }
  }

  function renderPrincipals(principals) {
    const analysts = principals.filter((p) => p.role === "analyst");
    $("tile-analysts").textContent = String(analysts.length);
    let active = 0;
    const tbody = $("analysts").tBodies[0];
    tbody.replaceChildren();
    if (!principals.length) return emptyRow(tbody, 4, "No principals.");
    // analysts first, then curators; each group by name
    const sorted = principals.slice().sort((a, b) => (a.role === b.role ? (a.name < b.name ? -1 : 1) : a.role === "analyst" ? -1 : 1));
    for (const p of sorted) {
      const keys = (p.keys || []).map((k) => {
        if (!k.revoked_at) active += 1;
        return h(
          "li",
          { class: k.revoked_at ? "key revoked" : "key active", title: k.revoked_at ? `revoked ${k.revoked_at}` : `created ${k.created_at}`, data: { keyId: k.id } },
          h("code", null, k.id),
          " ",
          k.revoked_at ? h("span", { class: "badge bad" }, `revoked ${fmtTime(k.revoked_at)}`) : h("span", { class: "badge ok" }, "active"),
        );
      });
      tbody.append(
        h(
          "tr",
          { data: { principal: p.name } },
          h("td", { class: "strong" }, p.name),
          h("td", null, h("span", { class: `badge role ${p.role}` }, p.role)),
          h("td", null, keys.length ? h("ul", { class: "keys" }, keys) : h("span", { class: "muted" }, "no keys")),
          timeCell(p.created_at),
        ),
      );
    }
    $("tile-keys").textContent = String(active);
  }

  function renderBudgets(budgets) {
    $("tile-budgets").textContent = String(budgets.length);
    const exhausted = budgets.filter((b) => !(b.remaining_epsilon > 0)).length;
    $("tile-budgets-note").textContent = exhausted ? `${exhausted} exhausted` : "";
    const tbody = $("budgets").tBodies[0];
    tbody.replaceChildren();
    if (!budgets.length) return emptyRow(tbody, 6, "No budgets granted yet.");
    for (const b of budgets) {
      const fraction = b.epsilon > 0 ? b.remaining_epsilon / b.epsilon : 0;
      tbody.append(
        h(
          "tr",
          { data: { dataset: b.dataset, analyst: b.analyst } },
          h("td", { class: "strong" }, b.analyst),
          h("td", null, b.dataset),
          h("td", { class: "num" }, fmt(b.epsilon)),
          h("td", { class: "num" }, fmt(b.spent_epsilon)),
          h(
            "td",
            { class: "bar-cell" },
            bar(fraction, { class: "small", label: `remaining ε of ${b.analyst} on ${b.dataset}`, data: { dataset: b.dataset, analyst: b.analyst } }),
            h("span", { class: "bar-text" }, `${fmt(b.remaining_epsilon)} left (${Math.round(clamp01(fraction) * 100)}%)`),
          ),
          h("td", { class: "num" }, b.delta > 0 ? `${fmt(b.spent_delta)} / ${fmt(b.delta)}` : "—"),
        ),
      );
    }
  }

  function renderAudit(entries) {
    const tbody = $("audit").tBodies[0];
    tbody.replaceChildren();
    if (!entries.length) return emptyRow(tbody, 8, "The audit log is empty.");
    for (const e of entries) {
      tbody.append(
        h(
          "tr",
          { data: { seq: e.seq } },
          h("td", { class: "num muted" }, String(e.seq)),
          timeCell(e.at),
          h("td", null, e.actor === null || e.actor === undefined ? h("span", { class: "muted" }, "anonymous") : e.actor),
          h("td", null, h("code", null, e.action)),
          h("td", null, e.dataset || ""),
          h("td", { class: "num" }, statusBadge(e.status)),
          h("td", { class: "num" }, e.epsilon === null || e.epsilon === undefined ? "" : fmt(Number(fractionValue(e.epsilon)))),
          h("td", { class: "outcome", title: e.outcome || "" }, e.outcome || ""),
        ),
      );
    }
  }

  /** The audit log stores amounts as exact fractions ("2/5") or decimals. */
  function fractionValue(text) {
    if (typeof text === "number") return text;
    const m = /^\s*(-?[\d.e+-]+)\s*\/\s*([\d.e+-]+)\s*$/i.exec(String(text));
    if (m) return Number(m[1]) / Number(m[2]);
    const x = Number(text);
    return Number.isFinite(x) ? x : text;
  }

  async function verifyLog() {
    const button = $("verify-log");
    const box = $("verify-result");
    button.disabled = true;
    setNotice(box, "Verifying the audit chain and the ledger…", "info");
    try {
      const r = await api("/v1/audit/verify");
      const unlogged = Array.isArray(r.unlogged_spends) ? r.unlogged_spends : [];
      const lines = [
        h("strong", null, r.ok ? "✓ OK — the audit log verifies." : "✗ The audit log does not verify."),
        ` ${r.entries} entries; the hash chain is intact`,
        r.head ? [" (head ", h("code", { title: r.head }, `${String(r.head).slice(0, 16)}…`), ")."] : ".",
      ];
      if (unlogged.length) {
        lines.push(h("div", null, `Warning: ledger spends without an audit entry (debited, no answer logged): ${unlogged.join(", ")}.`));
      } else {
        lines.push(h("div", { class: "small" }, "Every ledger spend has its audit entry."));
      }
      setNotice(box, h("div", null, lines), r.ok && !unlogged.length ? "ok" : "warn");
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) return;
      setNotice(box, h("div", null, h("strong", null, "✗ Verification failed. "), describe(err)), "error");
    } finally {
      button.disabled = false;
    }
    // the verification (and everything read since) is now in the log too
    if (state.me) {
      await guarded("audit-error", async () => {
        renderAudit(await loadNewest("/v1/audit", AUDIT_KEEP));
      });
    }
  }

  // -- the spending chart ------------------------------------------------------------------------

  function niceStep(range, target) {
    const raw = range / Math.max(1, target);
    const mag = 10 ** Math.floor(Math.log10(raw));
    const norm = raw / mag;
    return (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 2.5 ? 2.5 : norm <= 5 ? 5 : 10) * mag;
  }

  function timeTick(t, span) {
    const d = new Date(t);
    const hm = `${pad(d.getHours())}:${pad(d.getMinutes())}`;
    if (span < 10 * 60 * 1000) return `${hm}:${pad(d.getSeconds())}`;
    if (span < 24 * 3600 * 1000) return hm;
    return `${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${hm}`;
  }

  function renderChart(series) {
    const svg = $("spending-chart");
    svg.replaceChildren();
    const W = 880;
    const M = { left: 64, right: 24, top: 18, bottom: 52 };
    const plotH = 260;
    const legendRows = Math.max(1, Math.ceil(series.length / 3));
    const H = M.top + plotH + M.bottom + legendRows * 22 + 8;
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.setAttribute("preserveAspectRatio", "xMidYMin meet");
    const plotW = W - M.left - M.right;

    const all = [];
    const lines = series.map((item, i) => {
      const pts = (item.points || [])
        .map((p) => ({ t: parseTime(p.at), e: Number(p.epsilon), at: p.at }))
        .filter((p) => Number.isFinite(p.t) && Number.isFinite(p.e))
        .sort((a, b) => a.t - b.t);
      all.push(...pts);
      return { item, pts, color: i % 8 };
    });

    const now = Date.now();
    let t0 = all.length ? Math.min(...all.map((p) => p.t)) : now - 3600 * 1000;
    let t1 = all.length ? Math.max(now, ...all.map((p) => p.t)) : now;
    const span = Math.max(t1 - t0, 60 * 1000);
    t0 -= span * 0.04;
    t1 = Math.max(t1, t0 + span) + span * 0.02;
    const yTop = Math.max(
      1e-12,
      ...lines.map((l) => Number(l.item.budget_epsilon) || 0),
      ...all.map((p) => p.e),
    ) * 1.1;
    const x = (t) => M.left + ((t - t0) / (t1 - t0)) * plotW;
    const y = (e) => M.top + plotH - (e / yTop) * plotH;

    // grid and axes
    const grid = s("g", { class: "grid" });
    const yStep = niceStep(yTop, 5);
    for (let v = 0; v <= yTop + 1e-12; v += yStep) {
      grid.append(
        s("line", { x1: M.left, x2: M.left + plotW, y1: y(v), y2: y(v) }),
        s("text", { class: "tick", x: M.left - 8, y: y(v) + 4, "text-anchor": "end" }, fmt(v, 4)),
      );
    }
    const ticks = 5;
    for (let i = 0; i <= ticks; i += 1) {
      const t = t0 + ((t1 - t0) * i) / ticks;
      grid.append(
        s("line", { class: "xgrid", x1: x(t), x2: x(t), y1: M.top, y2: M.top + plotH }),
        s("text", { class: "tick", x: x(t), y: M.top + plotH + 18, "text-anchor": i === 0 ? "start" : i === ticks ? "end" : "middle" }, timeTick(t, t1 - t0)),
      );
    }
    svg.append(
      grid,
      s("line", { class: "axis", x1: M.left, x2: M.left + plotW, y1: M.top + plotH, y2: M.top + plotH }),
      s("line", { class: "axis", x1: M.left, x2: M.left, y1: M.top, y2: M.top + plotH }),
      s("text", { class: "axis-label", x: M.left + plotW / 2, y: M.top + plotH + 40, "text-anchor": "middle" }, "time (local)"),
      s("text", { class: "axis-label", x: 16, y: M.top + plotH / 2, "text-anchor": "middle", transform: `rotate(-90 16 ${M.top + plotH / 2})` }, "cumulative ε spent"),
    );

    // budgets (dashed), then the spending lines (steps: ε jumps at each spend)
    const plot = s("g", { class: "series" });
    for (const l of lines) {
      const be = Number(l.item.budget_epsilon);
      if (Number.isFinite(be) && be > 0) {
        plot.append(s("line", { class: `budget-line c${l.color}`, x1: M.left, x2: M.left + plotW, y1: y(be), y2: y(be) }, s("title", null, `budget of ${l.item.analyst} on ${l.item.dataset}: ε ${fmt(be)}`)));
      }
    }
    for (const l of lines) {
      let d = `M${x(t0).toFixed(1)},${y(0).toFixed(1)}`;
      let last = 0;
      for (const p of l.pts) {
        d += ` H${x(p.t).toFixed(1)} V${y(p.e).toFixed(1)}`;
        last = p.e;
      }
      d += ` H${x(t1).toFixed(1)}`;
      const label = `${l.item.analyst} · ${l.item.dataset}`;
      plot.append(
        s("path", { class: `series-line c${l.color}`, d, data: { analyst: l.item.analyst, dataset: l.item.dataset } }, s("title", null, `${label}: ε ${fmt(last)} spent`)),
      );
      for (const p of l.pts) {
        plot.append(s("circle", { class: `point c${l.color}`, cx: x(p.t).toFixed(1), cy: y(p.e).toFixed(1), r: 3.5 }, s("title", null, `${label}: ε ${fmt(p.e)} at ${fmtTime(p.at)}`)));
      }
    }
    svg.append(plot);

    if (!all.length) {
      svg.append(s("text", { class: "chart-empty", x: M.left + plotW / 2, y: M.top + plotH / 2, "text-anchor": "middle" }, series.length ? "No privacy budget spent yet." : "No budgets granted yet."));
    }

    // legend
    const legend = s("g", { class: "legend" });
    const colW = plotW / 3;
    lines.forEach((l, i) => {
      const lx = M.left + (i % 3) * colW;
      const ly = M.top + plotH + M.bottom + Math.floor(i / 3) * 22 + 8;
      const spent = l.pts.length ? l.pts[l.pts.length - 1].e : 0;
      legend.append(
        s(
          "g",
          { class: "legend-item", data: { analyst: l.item.analyst, dataset: l.item.dataset } },
          s("line", { class: `series-swatch c${l.color}`, x1: lx, x2: lx + 22, y1: ly, y2: ly }),
          s("text", { x: lx + 28, y: ly + 4 }, `${l.item.analyst} · ${l.item.dataset} (ε ${fmt(spent, 4)} of ${fmt(Number(l.item.budget_epsilon), 4)})`),
        ),
      );
    });
    svg.append(legend);
  }

  // ---------------------------------------------------------------------------------------------
  // the analyst's view
  // ---------------------------------------------------------------------------------------------

  async function loadAnalyst() {
    await Promise.all([
      guarded("my-budgets-error", async () => {
        const [budgets, datasets] = await Promise.all([api("/v1/budgets"), api("/v1/datasets")]);
        state.datasets = datasets.datasets || [];
        renderBudgetCards(budgets.budgets || []);
        renderDatasetChoice();
      }),
      loadHistory(),
    ]);
  }

  async function loadBudgets() {
    await guarded("my-budgets-error", async () => renderBudgetCards((await api("/v1/budgets")).budgets || []));
  }

  async function loadHistory() {
    await guarded("history-error", async () => {
      renderHistory(await loadNewest("/v1/history", HISTORY_KEEP));
    });
  }

  function renderBudgetCards(budgets) {
    state.budgets = budgets;
    const box = $("budget-cards");
    box.replaceChildren();
    if (!budgets.length) {
      box.append(h("p", { class: "muted" }, "You have no budgets yet: ask the curator for a grant."));
      return;
    }
    for (const b of budgets) {
      const fraction = b.epsilon > 0 ? b.remaining_epsilon / b.epsilon : 0;
      const exhausted = !(b.remaining_epsilon > 0);
      box.append(
        h(
          "article",
          { class: `card budget-card${exhausted ? " exhausted" : ""}`, data: { dataset: b.dataset } },
          h("div", { class: "budget-title" }, h("span", { class: "strong" }, b.dataset), h("span", { class: "pct" }, `${Math.round(clamp01(fraction) * 100)}%`)),
          bar(fraction, { class: "budget-bar", label: `remaining ε on ${b.dataset}`, data: { dataset: b.dataset } }),
          h("div", { class: "budget-remaining", data: { dataset: b.dataset } }, `remaining ε ${fmt(b.remaining_epsilon)} of ${fmt(b.epsilon)}`),
          h(
            "div",
            { class: "muted small" },
            `spent ε ${fmt(b.spent_epsilon)}`,
            b.delta > 0 ? ` · remaining δ ${fmt(b.remaining_delta)} of ${fmt(b.delta)}` : "",
            exhausted ? " · budget spent" : "",
          ),
        ),
      );
    }
  }

  function renderDatasetChoice() {
    const select = $("query-dataset");
    const previous = select.value;
    const names = state.budgets.map((b) => b.dataset);
    for (const d of state.datasets) if (!names.includes(d.name)) names.push(d.name);
    select.replaceChildren(...names.map((name) => h("option", { value: name }, name)));
    if (names.includes(previous)) select.value = previous;
    showSchema();
  }

  function showSchema() {
    const name = $("query-dataset").value;
    const box = $("query-schema");
    box.replaceChildren();
    $("query-sql").placeholder = name ? `SELECT COUNT(*) FROM ${name}` : "SELECT COUNT(*) FROM dataset";
    const d = state.datasets.find((x) => x.name === name);
    if (!d) return;
    box.append("Columns:", ...Object.entries(d.columns || {}).map(([col, spec]) => describeColumn(col, spec || {})));
  }

  function readQuery() {
    const dataset = $("query-dataset").value;
    const sql = $("query-sql").value;
    const epsText = $("query-epsilon").value.trim();
    const deltaText = $("query-delta").value.trim();
    const epsilon = Number(epsText);
    const delta = deltaText === "" ? 0 : Number(deltaText);
    if (!dataset) return { problem: "There is no dataset to query: ask the curator for a grant." };
    if (!sql.trim()) return { problem: "Write a SQL query first, e.g. SELECT COUNT(*) FROM " + dataset + "." };
    if (epsText === "" || !Number.isFinite(epsilon)) return { problem: "ε must be a number (e.g. 0.1)." };
    if (!Number.isFinite(delta)) return { problem: "δ must be a number (e.g. 0)." };
    return { dataset, body: { epsilon, delta, sql } };
  }

  function setQueryBusy(busy) {
    state.busy = busy;
    for (const id of ["query-run", "query-preview"]) $(id).disabled = busy;
    $("query-form").setAttribute("aria-busy", busy ? "true" : "false");
  }

  function showQueryError(err) {
    const box = $("query-error");
    if (!(err instanceof ApiError)) {
      setNotice(box, h("div", null, h("strong", null, "Error. "), String(err && err.message ? err.message : err)), "error");
      return;
    }
    const parts = [h("strong", { class: "error-title" }, ERROR_TITLES[err.code] || `Error ${err.status}`)];
    if (err.code === "budget_exceeded") {
      parts.push(h("div", null, "The query was refused: your remaining budget cannot pay for it. Nothing was spent and nothing was released."));
    }
    parts.push(h("div", { class: "error-message" }, err.message));
    if (err.body && typeof err.body.parameter === "string") parts.push(h("div", { class: "muted small" }, `parameter: ${err.body.parameter}`));
    const b = err.body && err.body.budget;
    if (b && typeof b === "object") {
      parts.push(h("div", { class: "small" }, `Remaining on ${b.dataset}: ε ${fmt(b.remaining_epsilon)} of ${fmt(b.epsilon)}, δ ${fmt(b.remaining_delta)} of ${fmt(b.delta)}.`));
    }
    if (err.code === "rate_limited") parts.push(h("div", { class: "small" }, "Wait a moment and try again."));
    setNotice(box, h("div", { "data-code": err.code }, parts), err.code === "budget_exceeded" ? "error budget-exceeded" : "error");
  }

  async function preview() {
    if (state.busy) return;
    const q = readQuery();
    setNotice($("query-error"), null);
    setNotice($("query-cost"), null);
    if (q.problem) return setNotice($("query-error"), q.problem, "error");
    setQueryBusy(true);
    try {
      const r = await api(`/v1/datasets/${encodeURIComponent(q.dataset)}/query/cost`, { method: "POST", body: q.body });
      const b = r.budget || {};
      const affordable = (r.cost.epsilon <= (b.remaining_epsilon ?? Infinity) * (1 + 1e-9)) && (r.cost.delta <= (b.remaining_delta ?? Infinity) * (1 + 1e-9));
      setNotice(
        $("query-cost"),
        h(
          "span",
          null,
          h("strong", null, "Preview: "),
          `this query would cost ε ${fmt(r.cost.epsilon)}, δ ${fmt(r.cost.delta)}`,
          b.remaining_epsilon !== undefined ? ` — you have ε ${fmt(b.remaining_epsilon)} of ${fmt(b.epsilon)} left on ${b.dataset}` : "",
          affordable ? ". Nothing was spent." : ". Your budget cannot pay for it.",
        ),
        affordable ? "info" : "warn",
      );
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 401)) showQueryError(err);
    } finally {
      setQueryBusy(false);
      if (state.me) await loadHistory();
    }
  }

  async function run(event) {
    if (event) event.preventDefault();
    if (state.busy) return;
    const q = readQuery();
    setNotice($("query-error"), null);
    setNotice($("query-cost"), null);
    if (q.problem) return setNotice($("query-error"), q.problem, "error");
    setQueryBusy(true);
    $("query-result").replaceChildren(h("p", { class: "muted" }, "Running…"));
    try {
      const r = await api(`/v1/datasets/${encodeURIComponent(q.dataset)}/query`, { method: "POST", body: q.body });
      renderResult(r, q);
      if (r.budget) mergeBudget(r.budget);
    } catch (err) {
      $("query-result").replaceChildren();
      if (!(err instanceof ApiError && err.status === 401)) showQueryError(err);
      if (err instanceof ApiError && err.body && err.body.budget) mergeBudget(err.body.budget);
    } finally {
      setQueryBusy(false);
      if (state.me) await Promise.all([loadBudgets(), loadHistory()]);
    }
  }

  function mergeBudget(budget) {
    const list = state.budgets.map((b) => (b.dataset === budget.dataset && b.analyst === budget.analyst ? budget : b));
    renderBudgetCards(list);
  }

  function resultColumns(r) {
    const rows = Array.isArray(r.rows) ? r.rows : [];
    const seen = new Set();
    const cols = [];
    const add = (c) => {
      if (!seen.has(c) && rows.some((row) => Object.prototype.hasOwnProperty.call(row, c))) {
        seen.add(c);
        cols.push(c);
      }
    };
    for (const g of r.groups || []) add(g);
    for (const a of r.aggregates || []) {
      add(a.name);
      add(`${a.name}_low`);
      add(`${a.name}_high`);
    }
    for (const row of rows) for (const c of Object.keys(row)) add(c);
    return cols;
  }

  function renderResult(r, q) {
    const box = $("query-result");
    box.replaceChildren();
    const rows = Array.isArray(r.rows) ? r.rows : [];
    const cols = resultColumns(r);
    const groups = new Set(r.groups || []);
    const confidence = typeof r.confidence === "number" ? `${fmt(r.confidence * 100, 4)}%` : "";
    const cost = r.cost || {};
    const b = r.budget || {};
    box.append(
      h(
        "div",
        { class: "result-head" },
        h("strong", null, "Result"),
        h("span", { class: "muted" }, ` · ${r.dataset || q.dataset}`),
        h("span", { class: "result-cost" }, ` · cost ε ${fmt(cost.epsilon)}, δ ${fmt(cost.delta)}`),
        b.remaining_epsilon !== undefined ? h("span", { class: "muted" }, ` · remaining ε ${fmt(b.remaining_epsilon)} of ${fmt(b.epsilon)}`) : null,
      ),
    );
    if (!rows.length) {
      box.append(h("p", { class: "muted" }, "No rows: no group was released."));
    } else {
      const head = h(
        "tr",
        null,
        cols.map((c) => {
          const ci = /_(low|high)$/.test(c) && !groups.has(c);
          return h("th", { class: groups.has(c) ? "" : "num", title: ci && confidence ? `${confidence} confidence interval bound` : null }, c);
        }),
      );
      const body = rows.map((row) =>
        h(
          "tr",
          null,
          cols.map((c) => {
            const v = row[c];
            const ci = /_(low|high)$/.test(c) && !groups.has(c);
            return h("td", { class: groups.has(c) ? "" : ci ? "num ci" : "num strong" }, typeof v === "number" ? fmt(v) : v === null || v === undefined ? "—" : String(v));
          }),
        ),
      );
      box.append(h("div", { class: "table-wrap" }, h("table", { class: "data result-table" }, h("thead", null, head), h("tbody", null, body))));
      if (confidence) box.append(h("p", { class: "muted small" }, `Columns ending in _low / _high are the bounds of ${confidence} confidence intervals for the noised values.`));
    }
    const aggs = Array.isArray(r.aggregates) ? r.aggregates : [];
    if (aggs.length) {
      box.append(
        h(
          "details",
          { class: "mechanisms" },
          h("summary", null, `Mechanisms (${aggs.length})`),
          h(
            "table",
            { class: "data" },
            h("thead", null, h("tr", null, ["Aggregate", "Kind", "Column", "ε", "Mechanism", "Scale"].map((t) => h("th", null, t)))),
            h(
              "tbody",
              null,
              aggs.map((a) =>
                h(
                  "tr",
                  null,
                  h("td", null, a.name),
                  h("td", null, a.kind),
                  h("td", null, a.column === null || a.column === undefined ? "—" : a.column),
                  h("td", { class: "num" }, fmt(a.epsilon)),
                  h("td", null, a.mechanism === undefined ? "—" : String(a.mechanism)),
                  h("td", { class: "num" }, fmt(a.scale)),
                ),
              ),
            ),
          ),
        ),
      );
    }
    const notes = Array.isArray(r.notes) ? r.notes : [];
    if (notes.length) box.append(h("ul", { class: "notes" }, notes.map((n) => h("li", null, typeof n === "string" ? n : JSON.stringify(n)))));
  }

  function renderHistory(entries) {
    const tbody = $("history").tBodies[0];
    tbody.replaceChildren();
    if (!entries.length) return emptyRow(tbody, 9, "No queries yet.");
    for (const e of entries) {
      tbody.append(
        h(
          "tr",
          { data: { seq: e.seq, action: e.action, status: e.status } },
          h("td", { class: "num muted" }, String(e.seq)),
          timeCell(e.at),
          h("td", null, h("span", { class: `badge action ${e.action === "query" ? "query" : "cost"}` }, e.action === "cost" ? "preview" : e.action)),
          h("td", null, e.dataset || ""),
          h("td", { class: "num" }, statusBadge(e.status)),
          h("td", { class: "num" }, e.epsilon === null || e.epsilon === undefined ? "" : fmt(e.epsilon)),
          h("td", { class: "num" }, e.delta === null || e.delta === undefined ? "" : fmt(e.delta)),
          h("td", { class: "query-text" }, h("code", null, e.query === null || e.query === undefined ? "" : String(e.query))),
          h("td", { class: "outcome", title: e.outcome || "" }, e.outcome || ""),
        ),
      );
    }
  }

  // ---------------------------------------------------------------------------------------------
  // start
  // ---------------------------------------------------------------------------------------------

  function start() {
    $("login-form").addEventListener("submit", onLogin);
    $("logout").addEventListener("click", () => signOut(null));
    $("refresh").addEventListener("click", () => refresh());
    $("verify-log").addEventListener("click", verifyLog);
    $("query-form").addEventListener("submit", run);
    $("query-preview").addEventListener("click", preview);
    $("query-dataset").addEventListener("change", showSchema);
    $("query-sql").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) run(event);
    });

    let saved = null;
    try {
      saved = sessionStorage.getItem(STORAGE_KEY);
    } catch (err) {
      saved = null;
    }
    if (!saved) {
      $("api-key").focus();
      return;
    }
    signIn(saved, { remembered: true }).catch((err) => {
      signOut(err instanceof ApiError && err.status === 401 ? "Your saved key is no longer accepted. Sign in again." : describe(err));
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
