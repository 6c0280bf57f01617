// The curator's view: datasets, principals and keys, budgets, the spending chart and the audit log.

import { api, ApiError, describe, guarded, loadNewest } from "./api.js";
import { renderChart } from "./chart.js";
import { AUDIT_KEEP, state } from "./state.js";
import { $, bar, clamp01, describeColumn, emptyRow, fmt, fmtTime, h, setNotice, statusBadge, timeCell } from "./ui.js";

export async function loadCurator() {
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

function renderDatasets(datasets) {
  state.datasets = datasets;
  $("tile-datasets").textContent = String(datasets.length);
  const tbody = $("datasets").tBodies[0];
  tbody.replaceChildren();
  if (!datasets.length) return emptyRow(tbody, 6, "No datasets registered yet.");
  for (const d of datasets) {
    const cols = Object.entries(declaredColumns(d)).map(([name, spec]) => describeColumn(name, spec || {}));
    // several tables: each private table's unit, and each table's source
    const units = d.tables ? Object.entries(d.tables).filter(([, m]) => !m.public).map(([t, m]) => `${t}.${m.privacy_unit || "row"}`).join(", ") : d.privacy_unit;
    const source = d.source && typeof d.source === "object" ? Object.entries(d.source).map(([t, p]) => `${t}=${p}`).join(", ") : d.source;
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
        h("td", null, units ? h("code", null, String(units)) : h("span", { class: "muted" }, "row"), bounds.length ? h("div", { class: "muted small" }, bounds.join(", ")) : null),
        h("td", { class: "path", title: source || "" }, source || "—"),
        timeCell(d.created_at),
      ),
    );
  }
}

/** A dataset's declared columns; for several tables, each as "table.column". */
function declaredColumns(d) {
  if (!d.tables) return d.columns || {};
  return Object.fromEntries(Object.entries(d.tables).flatMap(([t, m]) => Object.entries(m.columns || {}).map(([c, spec]) => [`${t}.${c}`, spec])));
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

export async function verifyLog() {
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
