// The report page of a jaxloc localization run (jaxloc/report/page.py inlines this script and the run's data).
"use strict";

const DATA = JSON.parse(document.getElementById("run-data").textContent);
const INFO = DATA.info;
const UNIT = DATA.unit;
const ONE = UNIT === "heads" ? "head" : "neuron";
const SVG = "http://www.w3.org/2000/svg";
const BY_NAME = new Map(INFO[UNIT].map((u) => [u.name, u]));
const TOP = new Set(INFO.top_k || []);
const UNIVERSAL = new Set(INFO["universal_" + UNIT] || []);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function fmt(x, digits = 3) {
  return x === null || x === undefined || Number.isNaN(x) ? "n/a" : Number(x).toFixed(digits);
}

function pct(x) {
  return x === null || x === undefined ? "n/a" : (100 * x).toFixed(1) + "%";
}

// Diverging colour around 0: red for negative values (ablating the unit lowers the score), blue for positive.
function colour(value, limit) {
  const t = Math.max(-1, Math.min(1, (value || 0) / (limit || 1)));
  const fade = Math.round(255 * (1 - Math.abs(t)));
  return t < 0 ? `rgb(255,${fade},${fade})` : `rgb(${fade},${fade},255)`;
}

function section(title, ...children) {
  return el("section", {}, el("h2", {}, title), ...children);
}

function table(header, rows) {
  const t = el("table", {}, el("tr", {}, ...header.map((h) => el("th", {}, h))));
  for (const row of rows) t.append(el("tr", {}, ...row.map((c) => el("td", {}, c))));
  return t;
}

function drops(unit) {
  const estimated = unit.estimated_relative_drop || {};
  const key = Object.keys(unit).find((k) => k.endsWith("_single_" + ONE + "_drop"));
  const measured = key ? unit[key] : {};
  const tasks = [...new Set([...Object.keys(estimated), ...Object.keys(measured)])];
  return table(["task", "estimated relative drop", (key || "measured").replace(/_/g, " ")],
               tasks.map((t) => [t, pct(estimated[t]), t in measured ? pct(measured[t]) : "not measured"]));
}

function showDetails(name) {
  const unit = BY_NAME.get(name);
  const panel = document.getElementById("details");
  panel.replaceChildren();
  if (!unit) return;
  const rank = INFO.top_k.indexOf(name);
  panel.append(el("h3", {}, name), el("p", {}, [
    `value ${fmt(unit.score, 4)}`,
    unit.interval ? `interval [${fmt(unit.interval[0], 4)}, ${fmt(unit.interval[1], 4)}]` : null,
    unit.selection_frequency !== undefined ? `selected in ${pct(unit.selection_frequency)} of bootstrap resamples`
                                           : null,
    rank >= 0 ? `top-${INFO.top_k.length} #${rank + 1}` : null,
    UNIVERSAL.has(name) ? "universal" : null,
  ].filter(Boolean).join(" · ")), drops(unit));
  document.querySelectorAll(".selected").forEach((n) => n.classList.remove("selected"));
  document.querySelectorAll(`[data-unit="${name}"]`).forEach((n) => n.classList.add("selected"));
}

function heatmap() {
  const coefficients = DATA.coefficients;
  const layers = INFO.num_layers, perLayer = INFO["num_" + UNIT];
  const values = coefficients || [...Array(layers)].map(() => Array(perLayer).fill(0));
  if (!coefficients) for (const u of INFO[UNIT]) values[u.layer][u.head] = u.score;
  const limit = Math.max(1e-12, ...values.flat().map(Math.abs));
  const cell = Math.max(10, Math.min(28, Math.floor(640 / perLayer))), pad = 34;
  const root = svg("svg", {width: pad + cell * perLayer + 10, height: pad + cell * layers + 10, id: "heatmap"});
  for (let h = 0; h < perLayer; h += Math.max(1, Math.ceil(perLayer / 16))) {
    const t = svg("text", {x: pad + cell * (h + 0.5), y: pad - 6, "text-anchor": "middle", class: "axis"});
    t.textContent = h;
    root.append(t);
  }
  for (let l = 0; l < layers; l++) {
    if (l % Math.max(1, Math.ceil(layers / 16)) === 0) {
      const t = svg("text", {x: pad - 6, y: pad + cell * (l + 0.7), "text-anchor": "end", class: "axis"});
      t.textContent = l;
      root.append(t);
    }
    for (let h = 0; h < perLayer; h++) {
      const name = `L${l}H${h}`;
      const rect = svg("rect", {x: pad + cell * h, y: pad + cell * l, width: cell, height: cell,
                                fill: colour(values[l][h], limit), "data-unit": name,
                                class: "cell" + (TOP.has(name) ? " top" : "")});
      const title = svg("title");
      title.textContent = `${name}: ${fmt(values[l][h], 4)}`;
      rect.append(title);
      rect.addEventListener("mouseenter", () => showDetails(name));
      rect.addEventListener("click", () => showDetails(name));
      root.append(rect);
      if (UNIVERSAL.has(name)) {
        const x = svg("text", {x: pad + cell * (h + 0.5), y: pad + cell * (l + 0.75), "text-anchor": "middle",
                               class: "universal"});
        x.textContent = "×";
        root.append(x);
      }
    }
  }
  const label = (INFO.solver || {}).value || "value";
  return section(`Every head: ${label} (${INFO.metric}); boxed: top-${INFO.top_k.length}, ×: universal`,
                 el("p", {class: "hint"}, "Hover or click a head for its numbers."), root);
}

function neuronView() {
  const layers = INFO.num_layers;
  const counts = Array(layers).fill(0);
  for (const name of INFO.top_k) counts[BY_NAME.get(name).layer] += 1;
  const most = Math.max(1, ...counts), width = 16;
  const root = svg("svg", {width: 40 + width * layers, height: 140, id: "layers"});
  counts.forEach((c, l) => {
    const height = 100 * c / most;
    const bar = svg("rect", {x: 30 + width * l, y: 110 - height, width: width - 2, height, class: "bar"});
    const title = svg("title");
    title.textContent = `layer ${l}: ${c} of the top-${INFO.top_k.length}`;
    bar.append(title);
    root.append(bar);
    const t = svg("text", {x: 30 + width * (l + 0.5), y: 126, "text-anchor": "middle", class: "axis"});
    t.textContent = l;
    root.append(t);
  });
  const rows = INFO.top_k.slice(0, 200).map((name) => {
    const u = BY_NAME.get(name);
    const row = el("tr", {"data-unit": name, class: "clickable"}, el("td", {}, name), el("td", {}, fmt(u.score, 4)),
                   el("td", {}, u.selection_frequency === undefined ? "" : pct(u.selection_frequency)));
    row.addEventListener("click", () => showDetails(name));
    return row;
  });
  const list = el("table", {}, el("tr", {}, el("th", {}, "neuron"), el("th", {}, "value"),
                                  el("th", {}, "selection frequency")), ...rows);
  return section(`Top-${INFO.top_k.length} neurons per layer`, root,
                 el("p", {class: "hint"}, "Click a neuron for its numbers."), el("div", {class: "scroll"}, list));
}

// A line chart of several series over k (x) in percent (y).
function chart(id, title, k, series, xLabel) {
  const w = 560, h = 300, left = 48, bottom = 36, top = 12;
  const all = series.flatMap((s) => s.values).filter((v) => v !== null && v !== undefined).map((v) => 100 * v);
  const lo = Math.min(0, ...all), hi = Math.max(1, ...all);
  const x = (i) => left + (w - left - 10) * (k.length > 1 ? i / (k.length - 1) : 0.5);
  const y = (v) => top + (h - top - bottom) * (1 - (100 * v - lo) / (hi - lo || 1));
  const root = svg("svg", {width: w + 170, height: h, id});
  root.append(svg("line", {x1: left, x2: w - 10, y1: y(0), y2: y(0), class: "zero"}));
  for (const v of [lo, (lo + hi) / 2, hi]) {
    const t = svg("text", {x: left - 6, y: y(v / 100) + 4, "text-anchor": "end", class: "axis"});
    t.textContent = v.toFixed(0) + "%";
    root.append(t);
  }
  k.forEach((kk, i) => {
    if (k.length <= 16 || i % Math.ceil(k.length / 16) === 0) {
      const t = svg("text", {x: x(i), y: h - bottom + 16, "text-anchor": "middle", class: "axis"});
      t.textContent = kk;
      root.append(t);
    }
  });
  const xt = svg("text", {x: (left + w) / 2, y: h - 4, "text-anchor": "middle", class: "axis"});
  xt.textContent = xLabel;
  root.append(xt);
  series.forEach((s, j) => {
    const points = s.values.map((v, i) => (v === null || v === undefined ? null : `${x(i)},${y(v)}`)).filter(Boolean);
    root.append(svg("polyline", {points: points.join(" "), class: "series", stroke: s.colour,
                                 "stroke-dasharray": s.dashed ? "5,4" : "none"}));
    const t = svg("text", {x: w + 2, y: top + 14 * (j + 1), fill: s.colour, class: "legend"});
    t.textContent = s.label;
    root.append(t);
  });
  return section(title, root);
}

const PALETTE = ["#000000", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

function curves() {
  const ablation = DATA.ablation;
  if (!ablation) return [el("p", {}, "This run did not validate: no held-out curves.")];
  const curve = ablation.specificity_curve;
  const tasks = [{label: `${curve.task.name} (target)`, values: curve.task.relative_drop, colour: PALETTE[0]},
                 ...Object.entries(curve.general).map(([name, g], i) => ({
                   label: name, values: g.relative_drop, colour: PALETTE[(i + 1) % PALETTE.length]}))];
  const specificity = [{label: `${ablation.selection}: target drop`, values: curve.task.relative_drop,
                        colour: PALETTE[0]},
                       {label: `${ablation.selection}: largest general`, values: curve.max_general_relative_drop,
                        colour: PALETTE[1]}];
  const raw = ablation.raw_specificity_curve;
  if (raw && raw.k.length === curve.k.length) {
    specificity.push({label: "raw: target drop", values: raw.task.relative_drop, colour: PALETTE[0], dashed: true},
                     {label: "raw: largest general", values: raw.max_general_relative_drop, colour: PALETTE[1],
                      dashed: true});
  }
  const axis = `${UNIT} ablated together (top-k)`;
  return [chart("ablation-curve", "Held-out relative drop of every task, top-k ablated together", curve.k, tasks,
                axis),
          chart("specificity-curve", "Specificity: the target drop against the largest general drop", curve.k,
                specificity, axis)];
}

function summary() {
  const heldOut = (DATA.ablation || {}).held_out;
  const facts = [
    `${INFO.method}, ${INFO.num_evaluations} evaluations, metric ${INFO.metric} (baseline ${fmt(INFO.baseline)})`,
    `selection: ${INFO.selection || "n/a"}`,
  ];
  if (heldOut) {
    const general = Object.entries(heldOut.general_relative_drop || {}).map(([t, d]) => `${t} ${pct(d)}`);
    facts.push(`top-${heldOut.k} ablated together on ${heldOut.num_docs} held-out documents: target drop ` +
               `${pct(heldOut.task_relative_drop)}; general: ${general.join(", ") || "none"}`);
  }
  const chips = el("p", {id: "top-units"}, `top-${INFO.top_k.length}: `);
  INFO.top_k.slice(0, 20).forEach((name) => {
    const chip = el("button", {"data-unit": name, class: "chip"}, name);
    chip.addEventListener("click", () => showDetails(name));
    chips.append(chip);
  });
  const universal = [...UNIVERSAL];
  return el("header", {}, el("h1", {}, `jaxloc: ${DATA.title}`), ...facts.map((f) => el("p", {}, f)), chips,
            el("p", {}, `universal ${UNIT}: ${universal.length ? universal.join(", ") : "none"}`));
}

function design() {
  const d = INFO.design;
  if (!d) return null;
  const per = d.ablations_per_head;
  return section("Design", el("p", {}, `${d.num_masks} masks; each ${ONE} ablated in ${per.min}–${per.max} ` +
                              `(median ${per.median}); rank ${d.rank}; mutual coherence ${fmt(d.mutual_coherence)}`),
                 el("p", {}, `always ablated together: ${d.identical_groups.map((g) => g.join("+")).join(", ") ||
                                                        "none"}`),
                 d.warning ? el("p", {class: "warning"}, d.warning) : "");
}

function settings() {
  const flags = Object.entries(INFO.flags || {}).map(([k, v]) => [`--${k}`, JSON.stringify(v)]);
  const timing = Object.entries(INFO.timing || {}).map(([k, v]) => [k.replace(/_/g, " "), fmt(v, 2)]);
  const engine = Object.entries(INFO.engine || {}).map(([k, v]) => [k.replace(/_/g, " "), String(v)]);
  return section("Settings and timings", el("div", {class: "columns"}, table(["flag", "value"], flags),
                                            table(["timing", "seconds"], timing), table(["engine", ""], engine)));
}

function main() {
  const app = document.getElementById("app");
  const details = section("Selected " + ONE, el("div", {id: "details"}, `Click a ${ONE}.`));
  app.append(summary(), el("div", {class: "columns"}, UNIT === "heads" ? heatmap() : neuronView(), details),
             ...curves());
  const d = design();
  if (d) app.append(d);
  app.append(settings());
  if (INFO.top_k.length) showDetails(INFO.top_k[0]);
}

main();
