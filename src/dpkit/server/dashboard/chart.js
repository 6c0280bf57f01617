// The curator's spending chart: cumulative ε spent over time, one line per budget (SVG).

import { $, fmt, fmtTime, pad, parseTime, s } from "./ui.js";

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

export function renderChart(series) {
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
