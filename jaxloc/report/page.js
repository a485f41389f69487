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
// Units whose value is a placeholder (never measured nor estimated): drawn hatched, shown without a value.
const UNMEASURED = new Set(DATA.unmeasured || []);
const REASONS = DATA.reasons || {};
// Units the method gave no value (a placeholder 0) that later checks ablated: no value shown, their drops are.
const PLACEHOLDER = new Set(DATA.placeholder || []);
const valueless = (name) => UNMEASURED.has(name) || PLACEHOLDER.has(name);

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
  const why = [...(rank >= 0 ? [`selected: #${rank + 1} of the top-${INFO.top_k.length}`] : []),
               ...(REASONS[name] || [])];
  if (UNMEASURED.has(name)) {
    panel.append(el("h3", {}, name), el("p", {class: "unmeasured-note"},
                 `not measured: ${INFO.method} never ablated this ${ONE} (its ranking placed it below the ` +
                 `${(INFO.solver || {}).measured_heads || "measured"} it measured), so it has no value`),
                 ...why.map((r) => el("p", {class: "reason"}, r)));
  } else if (PLACEHOLDER.has(name)) {
    panel.append(el("h3", {}, name), el("p", {class: "unmeasured-note"},
                 `${INFO.method} did not measure this ${ONE}, so it has no value; the checks after it ablated it:`),
                 ...why.map((r) => el("p", {class: "reason"}, r)), drops(unit));
  } else {
    panel.append(el("h3", {}, name), el("p", {}, [
      `value ${fmt(unit.score, 3)}`,
      unit.interval ? `interval [${fmt(unit.interval[0], 3)}, ${fmt(unit.interval[1], 3)}]` : null,
      unit.selection_frequency !== undefined ? `selected in ${pct(unit.selection_frequency)} of bootstrap resamples`
                                             : null,
    ].filter(Boolean).join(" · ")), ...why.map((r) => el("p", {class: "reason"}, r)), drops(unit));
  }
  document.querySelectorAll(".selected").forEach((n) => n.classList.remove("selected"));
  document.querySelectorAll(`[data-unit="${name}"]`).forEach((n) => {
    n.classList.add("selected");
    const mark = document.getElementById("highlight");  // drawn over the neighbouring cells
    if (mark && n.classList.contains("cell")) {
      for (const a of ["x", "y", "width", "height"]) mark.setAttribute(a, n.getAttribute(a));
      mark.setAttribute("visibility", "visible");
    }
  });
}

function heatmap() {
  const coefficients = DATA.coefficients;
  const layers = INFO.num_layers, perLayer = INFO["num_" + UNIT];
  const values = coefficients || [...Array(layers)].map(() => Array(perLayer).fill(0));
  if (!coefficients) for (const u of INFO[UNIT]) values[u.layer][u.head] = u.score;
  const measured = [];
  for (let l = 0; l < layers; l++) {
    for (let h = 0; h < perLayer; h++) if (!valueless(`L${l}H${h}`)) measured.push(values[l][h]);
  }
  const limit = Math.max(1e-12, ...measured.map(Math.abs));
  const cell = Math.max(10, Math.min(28, Math.floor(640 / perLayer))), pad = 48;
  const width = pad + cell * perLayer + 10, height = pad + cell * layers + 10;
  const root = svg("svg", {width, height, id: "heatmap"});
  root.append(hatch());
  const xTitle = svg("text", {x: pad + cell * perLayer / 2, y: 12, "text-anchor": "middle", class: "axis-title"});
  xTitle.textContent = "head";
  const yTitle = svg("text", {x: 0, y: 0, "text-anchor": "middle", class: "axis-title",
                              transform: `translate(12,${pad + cell * layers / 2}) rotate(-90)`});
  yTitle.textContent = "layer";
  root.append(xTitle, yTitle);
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
      const unmeasured = valueless(name);
      const rect = svg("rect", {x: pad + cell * h, y: pad + cell * l, width: cell, height: cell,
                                fill: unmeasured ? "url(#unmeasured)" : colour(values[l][h], limit), "data-unit": name,
                                class: "cell" + (TOP.has(name) ? " top" : "") + (unmeasured ? " unmeasured" : "")
                                       + (REASONS[name] ? " reasoned" : "")});
      const title = svg("title");
      title.textContent = unmeasured ? `${name}: not measured` : `${name}: ${fmt(values[l][h], 3)}`;
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
  root.append(svg("rect", {id: "highlight", visibility: "hidden"}));
  const label = (INFO.solver || {}).value || "value";
  return section(`Every head: ${label} (${INFO.metric}); boxed: top-${INFO.top_k.length}, ×: universal, ` +
                 "purple: rejected or universal (click for why), hatched: not measured",
                 el("p", {class: "hint"}, "Hover or click a head for its numbers."), root,
                 legend(limit, label, new Set([...UNMEASURED, ...PLACEHOLDER]).size));
}

// The diagonal hatching of a unit that was never measured.
function hatch() {
  const defs = svg("defs");
  const pattern = svg("pattern", {id: "unmeasured", width: 6, height: 6, patternUnits: "userSpaceOnUse",
                                  patternTransform: "rotate(45)"});
  pattern.append(svg("rect", {width: 6, height: 6, fill: "#e6e6e6"}),
                 svg("line", {x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#9a9a9a", "stroke-width": 2}));
  defs.append(pattern);
  return defs;
}

// The heatmap's colour scale, from -limit (red) through 0 (white) to +limit (blue), and the hatched swatch.
function legend(limit, label, unmeasured) {
  const w = 240, root = svg("svg", {width: w + 260, height: 46, id: "legend"});
  root.append(hatch());
  const steps = 48;
  for (let i = 0; i < steps; i++) {
    const v = -limit + (2 * limit * (i + 0.5)) / steps;
    root.append(svg("rect", {x: 10 + (w * i) / steps, y: 4, width: w / steps + 0.5, height: 14,
                             fill: colour(v, limit)}));
  }
  [[-limit, "start"], [0, "middle"], [limit, "end"]].forEach(([v, anchor], i) => {
    const t = svg("text", {x: 10 + (w * i) / 2, y: 32, "text-anchor": anchor, class: "axis"});
    t.textContent = fmt(v, 3);
    root.append(t);
  });
  const caption = svg("text", {x: 10, y: 44, class: "axis"});
  caption.textContent = `${label} (${INFO.metric}); red: ablating it lowers the score`;
  root.append(caption);
  if (unmeasured) {
    root.append(svg("rect", {x: w + 30, y: 4, width: 14, height: 14, fill: "url(#unmeasured)", stroke: "#999"}));
    const t = svg("text", {x: w + 50, y: 15, class: "axis", id: "legend-unmeasured"});
    t.textContent = `hatched: not measured by ${INFO.method} (${unmeasured} ${UNIT}), no value`;
    root.append(t);
  }
  return root;
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

// One general task's part of a decision: its drop, interval, documents and (when it counts) its verdict.
function verdict(t) {
  if (!t) return "n/a";
  let text = pct(t.drop);
  if (t.interval) text += ` [${pct(t.interval[0])}, ${pct(t.interval[1])}]`;
  if (t.docs) text += ` on ${t.docs}`;
  if (t.verdict === "veto") text += " (vetoes)";
  else if (t.verdict === "unable" && t.straddles) text += " (unable to veto)";
  return text;
}

// The confirmation's decisions: the rule, each general task's power to veto, then every decision the selection read.
function decisions() {
  const c = INFO.confirmation || {};
  const made = c.decisions || [];
  const power = DATA.power_lines || [];
  if (!made.length && !power.length) return null;
  const body = [];
  if (c.decision_rule) body.push(el("p", {}, `rule (${c.decision_rule.rule}): ${c.decision_rule.text}`));
  for (const line of power) body.push(el("p", {class: "power"}, "power to veto: " + line));
  if (made.length) {
    const tasks = Object.keys(made[0].tasks).slice(1);
    const rows = made.map((d) => [d.units.join("+") + (d.together ? " together" : " alone"),
                                  d.passed ? "passed" : "vetoed",
                                  d.confidence === null || d.confidence === undefined ? "n/a" : pct(d.confidence),
                                  ...tasks.map((t) => verdict(d.tasks[t]))]);
    body.push(table([ONE + "s", "decision", "confidence", ...tasks], rows));
  }
  if (c.extra_documents) {
    body.push(el("p", {}, `${c.extra_documents} more general-task documents scored where power or a straddling ` +
                          "interval asked (95% intervals: paired bootstrap over the documents)"));
  }
  return el("section", {id: "decisions"}, el("h2", {}, "Confirmation decisions"), ...body);
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
  const machine = Object.entries(INFO.machine || {}).map(([k, v]) => [k.replace(/_/g, " "),
                                                                      typeof v === "number" ? fmt(v, 0) : String(v)]);
  return section("Settings and timings", el("div", {class: "columns"}, table(["flag", "value"], flags),
                                            table(["timing", "seconds"], timing), table(["engine", ""], engine),
                                            table(["machine", ""], machine.length ? machine
                                                  : [["matmul peak", "not recorded by this run"]])));
}

// Where the weights came from: format, quantization, what jaxloc computed in, package or path, SHA-256.
function provenance() {
  const p = INFO.model_provenance;
  if (!p) {
    const known = DATA.packaged_model;
    return section("Model", el("p", {id: "provenance"}, `${INFO.model}: this run predates provenance records ` +
                                "(format, quantization, source, SHA-256; runs record them in the run file now)." +
                                (known ? ` The alias names the quantized GGUF ${known.file} (${known.install}), ` +
                                         "dequantized to float32 on CPU; the hash of the file this run read is " +
                                         "not known." : "")));
  }
  const shown = (v) => (typeof v === "object" && v !== null ? JSON.stringify(v) : String(v));
  const rows = Object.entries(p).map(([k, v]) => [k.replace(/_/g, " "), shown(v)]);
  const quantized = p.quantization ? `${p.format} ${p.quantization}, dequantized to ${p.dequantized_to}` : p.format;
  return section("Model", el("p", {id: "provenance"}, `${INFO.model}: ${quantized}`), table(["", ""], rows));
}

// A few held-out documents per task as the model answers them, unablated and with the top-k ablated together.
function examples() {
  const ex = DATA.examples;
  if (!ex) return null;
  const names = ex[UNIT] || [];
  const body = [el("p", {class: "hint"}, `Greedy output (at most ${ex.max_new_tokens} tokens, to the first newline ` +
                    `for a scored task) on the first ${ex.per_task} held-out documents of each task; ablated: ` +
                    `${names.join(", ")} together.`)];
  for (const [task, record] of Object.entries(ex.tasks)) {
    const rows = record.examples.map((e) => [el("pre", {}, (e.prompt_truncated ? "…" : "") + e.prompt),
                                             el("pre", {}, e.target), el("pre", {}, e.unablated),
                                             el("pre", {}, e.ablated),
                                             `${fmt(e.unablated_score, 2)} → ${fmt(e.ablated_score, 2)}`]);
    body.push(el("h3", {}, task), table(["prompt", "target", "output, unablated", `output, top-${ex.k} ablated`,
                                         record.metric], rows));
  }
  return el("section", {id: "examples"}, el("h2", {}, "Examples"), ...body);
}

// The unit table as CSV and JSON files, made in the page (no server).
function downloads() {
  const header = ["name", "layer", ONE, "measured", "value", "interval_low", "interval_high", "selection_frequency",
                  "reason"];
  const units = INFO[UNIT].map((u) => ({name: u.name, layer: u.layer, [ONE]: u[ONE], measured: !UNMEASURED.has(u.name),
                                        value: valueless(u.name) ? null : u.score,
                                        interval: valueless(u.name) ? null : u.interval,
                                        selection_frequency: u.selection_frequency,
                                        estimated_relative_drop: u.estimated_relative_drop,
                                        reason: (REASONS[u.name] || []).join("; ")}));
  const cell = (v) => (v === null || v === undefined ? "" : /[",\n]/.test(String(v))
                       ? `"${String(v).replace(/"/g, '""')}"` : String(v));
  const csv = [header.join(","), ...units.map((u) => [u.name, u.layer, u[ONE], u.measured, u.value,
                                                      u.interval && u.interval[0], u.interval && u.interval[1],
                                                      u.selection_frequency, u.reason].map(cell).join(","))];
  const link = (id, text, type, content, file) => el("a", {id, download: file, class: "chip",
                                                           href: URL.createObjectURL(new Blob([content], {type}))},
                                                     text);
  return el("p", {id: "downloads"}, `The ${ONE} table: `,
            link("download-csv", "CSV", "text/csv", csv.join("\n") + "\n", `${UNIT}.csv`), " ",
            link("download-json", "JSON", "application/json", JSON.stringify(units, null, 1), `${UNIT}.json`));
}

function main() {
  const app = document.getElementById("app");
  const details = section("Selected " + ONE, el("div", {id: "details"}, `Click a ${ONE}.`));
  app.append(summary(), downloads(),
             el("div", {class: "columns"}, UNIT === "heads" ? heatmap() : neuronView(), details),
             ...curves());
  for (const part of [decisions(), examples(), design(), provenance()]) if (part) app.append(part);
  app.append(settings());
  if (INFO.top_k.length) showDetails(INFO.top_k[0]);
}

main();
