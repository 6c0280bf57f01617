// Small DOM helpers of the dpkit curator dashboard. Every piece of server-provided text goes
// into the page through text nodes, never parsed as HTML: dataset and analyst names, query text
// and audit outcomes come from users.

const SVG_NS = "http://www.w3.org/2000/svg";

export const $ = (id) => document.getElementById(id);

/** An element; string children become text nodes (never HTML). */
export function h(tag, props, ...children) {
  return build(document.createElement(tag), props, children);
}

/** An SVG element, same conventions as h(). */
export function s(tag, props, ...children) {
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
export function fmt(x, digits = 6) {
  if (x === null || x === undefined) return "—";
  if (typeof x !== "number") return String(x);
  if (!Number.isFinite(x)) return String(x);
  return String(Number(x.toPrecision(digits)));
}

export function parseTime(iso) {
  if (typeof iso !== "string") return NaN;
  // Python's isoformat() has microseconds; keep milliseconds for Date.parse.
  return Date.parse(iso.replace(/(\.\d{3})\d+/, "$1"));
}

export const pad = (n) => String(n).padStart(2, "0");

export function fmtTime(iso) {
  const t = parseTime(iso);
  if (Number.isNaN(t)) return iso === null || iso === undefined ? "—" : String(iso);
  const d = new Date(t);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

export function timeCell(iso) {
  return h("td", { class: "nowrap", title: iso }, fmtTime(iso));
}

export function statusBadge(status) {
  const cls = status >= 500 ? "bad" : status >= 400 ? (status === 409 ? "warn" : "bad") : "ok";
  return h("span", { class: `badge status ${cls}` }, String(status));
}

export function setNotice(el, content, kind) {
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

export function emptyRow(tbody, columns, text) {
  tbody.append(h("tr", { class: "empty" }, h("td", { colspan: columns }, text)));
}

export function clamp01(x) {
  return Number.isFinite(x) ? Math.min(1, Math.max(0, x)) : 0;
}

/** A horizontal bar whose fill is `fraction` wide (the width is set through the CSSOM). */
export function bar(fraction, props) {
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

export function describeColumn(name, spec) {
  const type = spec && spec.type ? spec.type : "?";
  let detail = "";
  if (type === "numeric") detail = `[${fmt(spec.lower)}, ${fmt(spec.upper)}]`;
  else if (Array.isArray(spec.categories)) {
    const shown = spec.categories.slice(0, 8).map(String);
    detail = `{${shown.join(", ")}${spec.categories.length > 8 ? `, … ${spec.categories.length - 8} more` : ""}}`;
  }
  return h("span", { class: "chip" }, h("span", { class: "chip-name" }, name), ` ${type} ${detail}`.trimEnd());
}
