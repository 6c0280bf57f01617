// The analyst's view: budgets, the query form (preview and run), and the history of queries.

import { api, ApiError, ERROR_TITLES, guarded, loadNewest } from "./api.js";
import { renderResult } from "./result.js";
import { HISTORY_KEEP, state } from "./state.js";
import { $, bar, clamp01, describeColumn, emptyRow, fmt, h, setNotice, statusBadge, timeCell } from "./ui.js";

export async function loadAnalyst() {
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

export function showSchema() {
  const name = $("query-dataset").value;
  const box = $("query-schema");
  box.replaceChildren();
  $("query-sql").placeholder = name ? `SELECT COUNT(*) FROM ${name}` : "SELECT COUNT(*) FROM dataset";
  const d = state.datasets.find((x) => x.name === name);
  if (!d) return;
  const columns = d.tables ? Object.fromEntries(Object.entries(d.tables).flatMap(([t, m]) => Object.entries(m.columns || {}).map(([c, spec]) => [`${t}.${c}`, spec]))) : d.columns || {};
  if (d.tables) $("query-sql").placeholder = `SELECT COUNT(*) FROM ${Object.keys(d.tables).find((t) => !d.tables[t].public) || name}`;
  box.append("Columns:", ...Object.entries(columns).map(([col, spec]) => describeColumn(col, spec || {})));
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

export async function preview() {
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

export async function run(event) {
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
