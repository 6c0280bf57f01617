// A query's answer as the analyst sees it: the noised rows with their confidence intervals, what
// those intervals cover (the statistic after contribution bounding), the cost, and the mechanisms.

import { $, fmt, h } from "./ui.js";

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

// What the intervals cover, and the paid estimate of what bounding left out when there is one:
// one line each, shown right under the table.
function boundingLines(r) {
  const b = r.bounding && typeof r.bounding === "object" ? r.bounding : null;
  if (!b) return [];
  const lines = typeof b.text === "string" ? [b.text] : [];
  const est = b.estimate && typeof b.estimate === "object" ? b.estimate : null;
  for (const key of ["units_capped", "rows_clipped"]) {
    const c = est ? est[key] : null;
    if (!c || typeof c !== "object") continue;
    lines.push(`bounding estimate (paid, ε ${fmt(c.epsilon)}): ${c.what}: ${fmt(c.value)} (interval [${fmt(c.low)}, ${fmt(c.high)}])`);
  }
  return lines;
}

export function renderResult(r, q) {
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
  const covers = boundingLines(r);
  if (covers.length) box.append(h("div", { class: "bounding" }, covers.map((line) => h("p", { class: "small" }, line))));
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
                // what the number is the scale of: a count's noise, or a mean's own std. dev.; a
                // quantile has no noise scale but a rank-error bound (rows, at the confidence)
                typeof a.rank_error === "number"
                  ? h("td", { class: "num", title: `rank error bound at ${confidence || "the"} confidence, rows per group` }, `rank ±${fmt(a.rank_error)}`)
                  : h("td", { class: "num", title: a.scale_label === undefined ? "" : String(a.scale_label) }, fmt(a.scale)),
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
