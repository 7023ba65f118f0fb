// The vpo-evolve dashboard: plain DOM, no framework, nothing to build.
// Everything from the database is untrusted text: it only ever reaches the page through
// textContent or SVG attributes set to numbers, never through innerHTML.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const POLL_MS = 5000;
const state = { campaign: null, rank: "mean", objectives: [], rows: [], sortKey: null, timer: null };

// ---------------------------------------------------------------------------------------------
// DOM helpers

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function $(id) { return document.getElementById(id); }

function fmt(value, digits = 4) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return value.toLocaleString("en");
  return value.toFixed(digits);
}

// "record: +2.0% over best known" for a score above 1 (1 is the best known value), worded as
// problems.api.record_note words it (the overview's best values come with that note); null
// for a score that does not beat the best known value by more than its rounding (RECORD_MARGIN).
function recordNote(score) {
  if (!(score > 1 + 1e-7)) return null;
  const percent = (score - 1) * 100;
  if (percent >= 1e6) return `record: +${percent.toExponential(2)}% over best known`;
  const shown = Number(percent.toPrecision(2));
  const decimals = Math.max(1, 1 - Math.floor(Math.log10(shown)));
  return `record: +${percent.toFixed(decimals)}% over best known`;
}

async function getJSON(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.detail || body.error || `${response.status} ${path}`);
  return body;
}

function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") search.set(key, value);
  }
  return search.toString();
}

function showError(message) { $("error").textContent = message || ""; }

// ---------------------------------------------------------------------------------------------
// Charts: an SVG of fixed aspect drawn from arrays of numbers

const W = 460, H = 260, M = { left: 54, right: 12, top: 10, bottom: 34 };

// Round-numbered ticks between lo and hi, each with a label of as many decimals as the step needs.
function ticks(lo, hi, count = 5) {
  if (!(hi > lo)) return [[lo, fmt(lo, 3)]];
  const raw = (hi - lo) / count;
  const step = Math.pow(10, Math.floor(Math.log10(raw)));
  const nice = [1, 2, 5, 10].map((f) => f * step).find((s) => (hi - lo) / s <= count) || step * 10;
  const digits = Math.max(0, -Math.floor(Math.log10(nice) + 1e-9));
  const out = [];
  for (let v = Math.ceil(lo / nice) * nice; v <= hi + 1e-12; v += nice) {
    const tick = Math.abs(v) < nice * 1e-9 ? 0 : v;
    const label = Math.abs(tick) >= 10000
      ? tick.toLocaleString("en", { notation: "compact" })
      : tick.toLocaleString("en", { minimumFractionDigits: digits, maximumFractionDigits: digits });
    out.push([tick, label]);
  }
  return out;
}

function extent(values, pad = 0) {
  let lo = Math.min(...values), hi = Math.max(...values);
  if (!isFinite(lo)) return [0, 1];
  if (lo === hi) { lo -= 0.5 || 1; hi += 0.5; }
  const margin = (hi - lo) * pad;
  return [lo - margin, hi + margin];
}

// series: [{name, points: [[x, y, programId?]], kind, color?}]; kinds: "line" (a path), "trend"
// (a path with dots), "step" (a staircase with dots), "scatter", "cloud" (faint grey dots),
// "faint" (faint dots in the series' colour), "front" (the Pareto front: red dots joined),
// "reference" (a dashed grey line, no dots). `color` picks the colour of another series index.
// options.versions: [[x, step]] where a policy version first sampled, drawn as dotted lines
// labelled v<step> (about a dozen labels at most); options.notes: lines of text under the chart.
function chart(title, series, xlabel, ylabel, options = {}) {
  const box = el("div", { class: "plot" }, el("h3", { text: title }));
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
  root.append(svg("title", {}, title));
  const all = series.flatMap((s) => s.points);
  const notes = (options.notes || []).map((line) => el("p", { class: "plot-note", text: line }));
  if (!all.length) {
    root.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no data yet"));
    box.append(root, ...notes);
    return box;
  }
  const [x0, x1] = extent(all.map((p) => p[0]), 0.02);
  const [y0, y1] = extent(all.map((p) => p[1]), 0.05);
  const sx = (x) => M.left + ((x - x0) / (x1 - x0)) * (W - M.left - M.right);
  const sy = (y) => H - M.bottom - ((y - y0) / (y1 - y0)) * (H - M.top - M.bottom);
  for (const [t, label] of ticks(y0, y1)) {
    root.append(svg("line", { class: "grid", x1: M.left, x2: W - M.right, y1: sy(t), y2: sy(t) }));
    root.append(svg("text", { x: M.left - 4, y: sy(t) + 4, "text-anchor": "end" }, label));
  }
  for (const [t, label] of ticks(x0, x1)) {
    root.append(svg("text", { x: sx(t), y: H - M.bottom + 14, "text-anchor": "middle" }, label));
  }
  root.append(svg("line", { class: "axis", x1: M.left, x2: W - M.right, y1: H - M.bottom, y2: H - M.bottom }));
  root.append(svg("line", { class: "axis", x1: M.left, x2: M.left, y1: M.top, y2: H - M.bottom }));
  root.append(svg("text", { x: (M.left + W - M.right) / 2, y: H - 4, "text-anchor": "middle" }, xlabel));
  root.append(svg("text", { x: 12, y: (M.top + H - M.bottom) / 2, "text-anchor": "middle",
    transform: `rotate(-90 12 ${(M.top + H - M.bottom) / 2})` }, ylabel));
  const versions = (options.versions || []).filter(([x]) => x - 0.5 >= x0 && x - 0.5 <= x1);
  const every = Math.max(1, Math.ceil(versions.length / 12));
  versions.forEach(([x, step], i) => {
    const at = sx(x - 0.5); // between the last iteration of the version before and its first
    const mark = svg("line", { class: "version", x1: at, x2: at, y1: M.top, y2: H - M.bottom });
    mark.append(svg("title", {}, `policy version ${step} samples from iteration ${x}`));
    root.append(mark);
    // Above the plotting area, where no point is.
    if (i % every === 0) root.append(svg("text", { class: "version", x: at, y: M.top - 1, "text-anchor": "middle" }, `v${step}`));
  });
  series.forEach((s, i) => {
    const cls = `series-${(s.color ?? i) % 5}`;
    if (!["cloud", "scatter", "faint"].includes(s.kind)) {
      let d = "";
      s.points.forEach((p, j) => {
        if (j === 0) d += `M${sx(p[0])},${sy(p[1])}`;
        else if (s.kind === "step") d += `H${sx(p[0])}V${sy(p[1])}`;
        else d += `L${sx(p[0])},${sy(p[1])}`;
      });
      const kind = s.kind === "front" || s.kind === "reference" ? s.kind : `line ${cls}`;
      root.append(svg("path", { class: kind, d }));
    }
    if (s.kind !== "line" && s.kind !== "reference") {
      for (const p of s.points) {
        if (s.kind === "step" && p[2] === undefined) continue; // the line's run to the present
        const kind = s.kind === "cloud" ? "cloud" : s.kind === "front" ? "front"
          : s.kind === "faint" ? `faint ${cls}` : `point ${cls}`;
        const small = s.kind === "cloud" || s.kind === "faint";
        const dot = svg("circle", { class: kind, cx: sx(p[0]), cy: sy(p[1]), r: small ? 2.5 : 3.5 });
        if (p[2] !== undefined) {
          dot.append(svg("title", {}, `program ${p[2]}: ${fmt(p[0])}, ${fmt(p[1])}`));
          dot.addEventListener("click", () => { location.hash = `#/program/${p[2]}`; });
        }
        root.append(dot);
      }
    }
  });
  const named = series.map((s, i) => [s, i]).filter(([s]) => s.name);
  if (named.length || versions.length) {
    const keys = named.map(([s, i]) => el("span", {}, el("i", { class: s.kind === "front"
      || s.kind === "reference" ? s.kind : `series-${(s.color ?? i) % 5}` }), s.name));
    if (versions.length) keys.push(el("span", {}, el("i", { class: "version" }), "a new policy version samples"));
    box.append(el("div", { class: "legend" }, ...keys));
  }
  box.append(root, ...notes);
  return box;
}

// ---------------------------------------------------------------------------------------------
// Overview

function card(label, value, href, note, detail) {
  const shown = href ? el("a", { href, text: value }) : document.createTextNode(value);
  const box = el("div", { class: note ? "card record" : "card" }, el("div", { class: "label", text: label }),
    el("div", { class: "value" }, shown));
  if (note) box.append(el("div", { class: "note", text: note }));
  if (detail) box.append(el("div", { class: "detail", text: detail }));
  return box;
}

// 42 s, 3 min 20 s, 2 h 05 min, 3 d 4 h: as `vpo status` prints a duration.
function duration(seconds) {
  const whole = Math.max(0, Math.round(seconds));
  const [m, h, d] = [Math.floor(whole / 60), Math.floor(whole / 3600), Math.floor(whole / 86400)];
  if (d) return `${d} d ${h % 24} h`;
  if (h) return `${h} h ${String(m % 60).padStart(2, "0")} min`;
  return m ? `${m} min ${String(whole % 60).padStart(2, "0")} s` : `${whole} s`;
}

function renderSummary(o) {
  const s = o.status;
  const rejected = Object.values(s.rejections).reduce((a, b) => a + b, 0);
  const cards = [
    card("campaign", `${o.campaign.name} (${o.campaign.status})`),
    card("problem", o.campaign.problem),
    card("programs", fmt(o.programs)),
    card("valid", fmt(o.valid_programs)),
    card("iterations", s.budget === null ? fmt(s.iterations) : `${fmt(s.iterations)} of ${fmt(s.budget)}`,
      null, null, s.stopped_by ? `stopped by ${s.stopped_by}` : undefined),
    card("elapsed", `${duration(s.elapsed_s)}${s.running || o.campaign.status !== "running" ? "" : " (idle)"}`),
    card("time left", s.eta_s === null ? "–" : `about ${duration(s.eta_s)}`),
    card("tokens", fmt(o.tokens)),
    card("policy steps", fmt(o.policy_steps)),
  ];
  const why = Object.entries(s.rejections).filter(([, n]) => n).map(([k, n]) => `${k} ${fmt(n)}`);
  cards.push(card("rejected candidates", `${fmt(rejected)} of ${fmt(s.candidates)}`, null,
    null, why.join(" · ")));
  for (const [name, best] of Object.entries(o.best)) {
    const raw = best.raw === null ? "" : ` (raw ${fmt(best.raw, 6)})`;
    // Records are kept only when beaten: a seed holding one is still the best found.
    const seed = o.best_origin[name] === "seed" ? `program ${best.program_id} is still the seed: nothing beat it` : null;
    const box = card(`best ${name}`, `${fmt(best.score)}${raw}`, `#/program/${best.program_id}`, best.record, seed);
    if (seed) box.classList.add("seed");
    cards.push(box);
  }
  const rollouts = o.versions.reduce((a, v) => a + v.rollouts, 0);
  if (o.policy_steps || o.versions.some((v) => v.step > 0)) {
    const trained = o.versions.filter((v) => v.changed).reduce((a, v) => a + v.rollouts, 0);
    const share = rollouts ? ` (${Math.round((100 * trained) / rollouts)}%)` : "";
    cards.push(card("sampled by trained weights", `${fmt(trained)} of ${fmt(rollouts)}${share}`));
  }
  $("summary").replaceChildren(...cards);
  renderVersions(o);
}

// What each policy version sampled: a table, once a version other than the start has any.
function renderVersions(o) {
  const box = $("versions");
  box.hidden = !o.versions.some((v) => v.step > 0);
  if (box.hidden) return;
  const head = el("tr", {}, ...["version", "groups", "rollouts", "parse rate", "pool diversity",
    ...o.objectives.map((n) => `best ${n}`)].map((t) => el("th", { text: t })));
  const rows = o.versions.map((v) => el("tr", {},
    el("td", { text: v.step === 0 ? "0 (start)" : String(v.step) }),
    el("td", { text: fmt(v.groups) }), el("td", { text: fmt(v.rollouts) }),
    el("td", { text: fmt(v.parse_rate, 2) }), el("td", { text: fmt(v.pool_diversity, 3) }),
    ...o.objectives.map((n) => el("td", { text: fmt(v.best[n] ?? null) }))));
  box.replaceChildren(el("h3", { text: "What each policy version sampled" }),
    el("table", { id: "versions-table" }, el("thead", {}, head), el("tbody", {}, ...rows)));
}

function renderPlots(o) {
  const plots = [];
  const valid = o.valid_programs;
  const best = o.objectives.map((name) => {
    const points = o.records[name].map(([n, id, score]) => [n, score, id]);
    if (points.length && points[points.length - 1][0] < valid) points.push([valid, points[points.length - 1][1]]);
    return { name, kind: "step", points };
  });
  // The best known value, drawn once a record passes it (below, it would squash the curves).
  const ends = best.flatMap((s) => s.points.map((p) => p[0]));
  if (best.some((s) => s.points.some((p) => p[1] > 1))) {
    best.push({ name: "best known value", kind: "reference",
      points: [[Math.min(...ends), 1], [Math.max(...ends), 1]] });
  }
  // A best value of 0 is every valid program's value: the best as the one value of a column.
  const bests = o.objectives.filter((name) => o.records[name].length)
    .map((name) => [name, [o.records[name][o.records[name].length - 1][2]]]);
  plots.push(chart("Best value per objective", best, "valid programs evaluated", "best score",
    { notes: zeroNotes(bests, o.notes, false) }));
  o.fronts.forEach((front) => {
    const xi = o.objectives.indexOf(front.x) + 1, yi = o.objectives.indexOf(front.y) + 1;
    const columns = [[front.x, o.cloud.map((p) => p[xi])], [front.y, o.cloud.map((p) => p[yi])]];
    plots.push(chart(`Pareto front: ${front.x} vs ${front.y}`, [
      { kind: "cloud", points: o.cloud.map((p) => [p[xi], p[yi], p[0]]) },
      { name: "front", kind: "front", points: front.points.map(([id, x, y]) => [x, y, id]) },
    ], front.x, front.y, { notes: zeroNotes(columns, o.notes, true) }));
  });
  plots.push(...trainingCharts(o.training));
  plots.push(measuresChart(o.measures, o.version_starts));
  plots.push(chart("Programs stored", [{ name: "programs", kind: "line", points: o.progress.programs }],
    "minutes", "programs"));
  plots.push(chart("Tokens generated", [{ name: "tokens", kind: "line", points: o.progress.tokens }],
    "minutes", "tokens"));
  $("plots").replaceChildren(...plots);
}

// A line per objective at 0 in its column of values ([[name, values]]): at 0 for every program,
// with the problem's own description of the objective where it has one (`notes`: it says why,
// as a gate holding simplicity at 0 until the fit beats it); with `partial`, also one at 0 for
// some of them, saying how many, where the problem describes it. As exports.zero_notes words it.
function zeroNotes(columns, notes, partial) {
  const lines = [];
  for (const [name, values] of columns) {
    const zeros = values.filter((v) => v === 0).length;
    const about = notes[name];
    if (values.length && zeros === values.length) {
      lines.push(`${name} is 0 for every valid program${about ? `: ${about}` : "."}`);
    } else if (partial && zeros && about) {
      lines.push(`${name} is 0 for ${fmt(zeros)} of ${fmt(values.length)} programs drawn: ${about}`);
    }
  }
  return lines;
}

// The metrics each training step stored (trainer/train.py StepMetrics), a chart per quantity
// in the order of training.png's groups (loss, KL, ratio and clipping, set score and
// diversity, the rest), each y-axis saying what it shows; one placeholder before the first
// step. A chart none of the steps has a value for is left out, and so is one whose every
// metric held one value over two or more steps (a note under the charts names them).
const TRAINING = [
  ["Training: loss", "loss", [["loss", "loss"], ["policy_loss", "policy loss"]]],
  ["Training: KL to the reference", "KL per token", [["kl", "KL"]]],
  ["Training: ratio to the sampling policy", "π_θ / π_old, token mean", [["mean_ratio", "mean ratio"]]],
  ["Training: clip fraction", "share of tokens clipped", [["clip_fraction", "clip fraction"]]],
  ["Training: set score and diversity", "score · L1 distance", [["set_score", "set score"], ["diversity", "diversity"]]],
  ["Training: gradient norm", "gradient norm", [["grad_norm", "grad norm"]]],
  ["Training: staleness", "versions behind", [["staleness", "policy versions behind"]]],
];

function trainingCharts(steps) {
  if (!steps.length) return [chart("Training (no policy versions yet)", [], "training step", "")];
  const charts = TRAINING.map(([title, unit, keys]) => [title, unit, keys.map(([key, name]) => ({
    key, name, kind: "trend", points: steps.filter((m) => key in m).map((m) => [m.step, m[key]]) }))])
    .filter(([, , series]) => series.some((s) => s.points.length));
  const held = (s) => s.points.length > 1 && s.points.every((p) => p[1] === s.points[0][1]);
  const constant = charts.filter(([, , series]) => series.every(held));
  const shown = charts.filter((c) => !constant.includes(c))
    .map(([title, unit, series]) => chart(title, series, "training step", unit));
  if (constant.length) {
    const names = constant.flatMap(([, , series]) => series.map((s) => `${s.key} ${fmt(s.points[0][1])}`));
    shown.push(el("p", { class: "plot-note", id: "training-held",
      text: `Training charts left out, the same at every step: ${names.join(", ")}.` }));
  }
  return shown;
}

// Each iteration's pool diversity and parse rate as faint dots, their rolling means as lines in
// the same colours; an iteration without a value (skipped, or fewer than two programs for the
// diversity) has no dot. A dotted line where a policy version first sampled ([[iteration, step]]).
function measuresChart(m, starts) {
  const points = (key) => m.iteration.map((x, j) => [x, m[key][j]]).filter((p) => p[1] !== null);
  const series = [];
  [["pool_diversity", "pool diversity"], ["parse_rate", "parse rate"]].forEach(([key, label], color) => {
    series.push({ kind: "faint", color, points: points(key) });
    series.push({ name: `${label} (mean of ${m.window})`, kind: "line", color, points: points(`${key}_mean`) });
  });
  return chart("Pool diversity and parse rate per iteration", series, "iteration",
    "diversity (L1) · share parsed", { versions: starts });
}

function renderRankChoices(objectives) {
  const select = $("rank");
  const wanted = ["mean", ...objectives.map((o) => `objective:${o}`), "weights"];
  const have = [...select.options].map((o) => o.value);
  if (JSON.stringify(wanted) === JSON.stringify(have)) return;
  select.replaceChildren(...wanted.map((value) => el("option", { value,
    text: value === "mean" ? "mean score" : value === "weights" ? "weighted…" : value.slice(10) })));
  if (!wanted.includes(state.rank)) state.rank = "mean";
  select.value = state.rank;
}

async function loadTop() {
  const rank = state.rank;
  const params = { campaign: state.campaign, n: $("rows").value || 50 };
  if (rank.startsWith("objective:")) params.objective = rank.slice(10);
  if (rank === "weights") params.weights = $("weights").value || state.objectives.map(() => 1).join(",");
  try {
    state.rows = await getJSON(`/api/top?${query(params)}`);
    $("top-error").textContent = "";
  } catch (error) {
    $("top-error").textContent = error.message;
    state.rows = [];
  }
  state.sortKey = null;
  renderTop();
}

function renderTop() {
  const columns = [
    ["rank", "#"], ["id", "id"], ["value", "value"],
    ...state.objectives.map((o) => [`score:${o}`, o]),
    ["island", "island"], ["generation", "gen"], ["origin", "origin"], ["parent_id", "parent"],
    ["gist", "program"],
  ];
  const head = el("tr", {}, ...columns.map(([key, label]) => {
    const th = el("th", { text: label, "data-key": key, class: ["origin", "gist"].includes(key) ? "text" : "" });
    if (state.sortKey === key || (!state.sortKey && key === "value")) th.classList.add("sorted");
    if (key !== "gist") th.addEventListener("click", () => sortBy(key));
    return th;
  }));
  $("top").tHead.replaceChildren(head);
  const rows = state.rows.map((row, i) => ({ ...row, rank: row.rank ?? i + 1 }));
  state.rows = rows;
  const body = rows.map((row) => {
    const tr = el("tr", { "data-id": row.id }, ...columns.map(([key]) => {
      if (key === "gist") return gistCell(row.gist);
      const score = key.startsWith("score:") || key === "value";
      const value = key.startsWith("score:") ? row.scores[key.slice(6)] : row[key];
      const text = score && typeof value === "number" ? value.toFixed(4) : fmt(value);
      const note = key.startsWith("score:") ? recordNote(value) : null;
      if (note) return el("td", { text, class: "record", title: note });
      return el("td", { text, class: key === "origin" ? "text" : "" });
    }));
    tr.addEventListener("click", () => { location.hash = `#/program/${row.id}`; });
    return tr;
  });
  $("top").tBodies[0].replaceChildren(...body);
}

// A program in a line, as text: the expression it returns (an equation's, or its entry
// function's only return) or the first line of its code; the code, cut short, on hover, and
// all of it on the program's page.
function gistCell(gist) {
  if (!gist) return el("td", { class: "gist text", text: "–" });
  const shown = gist.kind === "expression" ? el("code", { text: gist.text }) : document.createTextNode(gist.text);
  return el("td", { class: `gist text ${gist.kind}`, title: gist.code }, shown);
}

function sortBy(key) {
  if (key.startsWith("score:")) {
    // Another objective's ranking is a new query: the best by it may not be on the page yet.
    state.rank = `objective:${key.slice(6)}`;
    $("rank").value = state.rank;
    loadTop();
    return;
  }
  const get = (row) => (row[key] ?? -Infinity);
  const ascending = ["rank", "id", "generation", "island", "origin", "parent_id"].includes(key);
  state.rows.sort((a, b) => (get(a) < get(b) ? -1 : get(a) > get(b) ? 1 : 0) * (ascending ? 1 : -1));
  state.sortKey = key;
  renderTop();
}

async function refreshOverview() {
  if (state.campaign === null) return;
  try {
    const o = await getJSON(`/api/overview?campaign=${state.campaign}`);
    state.objectives = o.objectives;
    renderSummary(o);
    renderPlots(o);
    renderRankChoices(o.objectives);
    if (state.lastSeen !== o.last_program_id) {
      state.lastSeen = o.last_program_id;
      await loadTop();
    }
    // "live" only while the campaign writes: a finished (or failed, stopped) one says so, and
    // one still marked running that wrote nothing lately says it is idle (killed, or waiting).
    const running = o.campaign.status === "running";
    const said = running ? (o.status.running ? "live" : "idle: nothing written lately") : o.campaign.status;
    $("live").textContent = `${said} · updated ${new Date().toLocaleTimeString()}`;
    $("live").className = `live ${running ? (o.status.running ? "ok" : "idle") : "done"}`;
    showError("");
  } catch (error) {
    $("live").textContent = `not updating: ${error.message}`;
    $("live").className = "live stale";
  }
}

// ---------------------------------------------------------------------------------------------
// Program page

const KEYWORDS = new Set(("and as assert async await break class continue def del elif else except " +
  "finally for from global if import in is lambda nonlocal not or pass raise return try while " +
  "with yield None True False").split(" "));

// Python highlighting by a small tokenizer; each token becomes a text node or a span's text.
function highlight(target, code) {
  const pattern = /(#[^\n]*)|("""[\s\S]*?"""|'''[\s\S]*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')|\b(\d+(?:\.\d+)?(?:e[+-]?\d+)?)\b|\b([A-Za-z_]\w*)\b/g;
  const parts = [];
  let last = 0;
  for (const match of code.matchAll(pattern)) {
    const [text, comment, string, number, word] = match;
    const kind = comment ? "com" : string ? "str" : number ? "num" : KEYWORDS.has(word) ? "kw" : null;
    if (!kind) continue;
    if (match.index > last) parts.push(document.createTextNode(code.slice(last, match.index)));
    parts.push(el("span", { class: kind, text }));
    last = match.index + text.length;
  }
  parts.push(document.createTextNode(code.slice(last)));
  target.replaceChildren(...parts);
}

function renderDiff(target, diff) {
  const lines = diff.split("\n").map((line) => {
    const cls = line.startsWith("@@") ? "hunk" : line.startsWith("+") && !line.startsWith("+++") ? "add"
      : line.startsWith("-") && !line.startsWith("---") ? "del" : "";
    return el("span", { class: cls, text: line + "\n" });
  });
  target.replaceChildren(...lines);
}

// A score, and the record it sets when above the best known value.
function scoreCell(score) {
  const note = recordNote(score);
  if (!note) return el("td", { text: score.toFixed(4) });
  return el("td", { class: "record", text: `${score.toFixed(4)} (${note})` });
}

function fact(label, value, href) {
  const shown = href ? el("a", { href, text: value }) : document.createTextNode(value);
  return el("span", {}, el("b", { text: label }), shown);
}

async function showProgram(id) {
  $("overview-page").hidden = true;
  $("tree-page").hidden = true;
  $("program-page").hidden = false;
  $("live").textContent = "a program page: updates resume on the overview";
  $("live").className = "live";
  try {
    const p = await getJSON(`/api/programs/${id}`);
    $("program-title").textContent = `Program ${p.id}`;
    const facts = [fact("status", p.status), fact("origin", p.origin), fact("island", String(p.island)),
      fact("generation", String(p.generation)), fact("eval seconds", fmt(p.eval_seconds, 2))];
    if (p.parent_id !== null) facts.push(fact("parent", String(p.parent_id), `#/program/${p.parent_id}`));
    $("program-facts").replaceChildren(...facts);
    $("program-scores").tBodies[0].replaceChildren(...Object.keys(p.scores).map((name) =>
      el("tr", {}, el("td", { class: "text", text: name }), scoreCell(p.scores[name]),
        el("td", { text: fmt(p.raw[name], 8) }))));
    highlight($("program-code"), p.code);
    $("diff-title").hidden = $("program-diff").hidden = p.diff === null;
    if (p.diff !== null) renderDiff($("program-diff"), p.diff || "(same code as its parent)");
    renderEvaluation(p);
    const detail = p.origin_detail;
    if (detail) {
      const t = detail.trajectory;
      $("provenance").replaceChildren(fact("iteration", String(detail.iteration)),
        fact("group", String(detail.group_id)), fact("rollout", `${t.position} (${t.num_tokens} tokens, ${t.finish_reason})`),
        fact("parse", t.parse_status), fact("trained in step", detail.trained_in_step === null ? "not yet" : String(detail.trained_in_step)),
        fact("drafts shown", detail.draft_ids.length ? "" : "none"),
        ...detail.draft_ids.map((d) => el("a", { href: `#/program/${d}`, text: String(d) })));
      $("completion").textContent = t.completion;
      await renderStory(id);
    } else {
      $("provenance").replaceChildren(fact("written by", p.origin === "seed" ? "the seed" : "a migration"));
      $("completion").textContent = "";
      $("story").hidden = true;
    }
    showError("");
    renderLineage(await getJSON(`/api/programs/${id}/lineage`));
  } catch (error) {
    showError(error.message);
  }
}

function renderLineage(l) {
  $("lineage-facts").replaceChildren(fact("depth", String(l.depth)), fact("islands", l.islands.join(", ")),
    fact("mean branching", fmt(l.branching, 2)), fact("drafts shown on the way", String(l.drafts_shown)));
  // Ancestors in a column, oldest on top; drafts to the right of the program they were shown for.
  const path = [...l.path].reverse();
  const drafts = new Map();
  for (const edge of l.edges) {
    if (edge.kind !== "draft") continue;
    if (!drafts.has(edge.to)) drafts.set(edge.to, []);
    drafts.get(edge.to).push(edge.from);
  }
  const rowH = 34, boxW = 150, boxH = 24, draftX = 200, draftStep = 80;
  const widest = Math.max(0, ...[...drafts.values()].map((d) => d.length));
  const width = draftX + widest * draftStep + 20, height = path.length * rowH + 10;
  const root = svg("svg", { viewBox: `0 0 ${Math.max(width, 260)} ${height}`, width: Math.max(width, 260), height });
  const node = (x, y, w, label, id, kind) => {
    const g = svg("g", { class: `node ${kind}`, transform: `translate(${x},${y})` });
    g.append(svg("rect", { width: w, height: boxH, rx: 4 }), svg("text", { x: 6, y: 16 }, label));
    g.addEventListener("click", () => { location.hash = `#/program/${id}`; });
    root.append(g);
  };
  path.forEach((p, i) => {
    const y = 5 + i * rowH;
    if (i > 0) root.append(svg("path", { class: "edge", d: `M20,${y - rowH + boxH}V${y}` }));
    (drafts.get(p.id) || []).forEach((d, j) => {
      const x = draftX + j * draftStep;
      root.append(svg("path", { class: "edge draft", d: `M${x},${y + boxH / 2}H${boxW + 10}` }));
      node(x, y, draftStep - 10, `draft ${d}`, d, "draft");
    });
    const label = `${p.id} · gen ${p.generation} · isl ${p.island} · ${p.children} ch`;
    node(10, y, boxW, label, p.id, p.id === l.program_id ? "current" : "");
  });
  $("lineage").replaceChildren(root);
}

// ---------------------------------------------------------------------------------------------
// Routing and polling

function route() {
  $("tree-page").hidden = true;
  const match = location.hash.match(/^#\/program\/(\d+)$/);
  if (match) {
    showProgram(Number(match[1]));
  } else if (location.hash === "#/tree") {
    showTree();
  } else {
    $("program-page").hidden = true;
    $("overview-page").hidden = false;
    refreshOverview();
  }
}

function poll() {
  clearTimeout(state.timer);
  state.timer = setTimeout(async () => {
    if (!$("pause").checked && !$("overview-page").hidden) await refreshOverview();
    poll();
  }, POLL_MS);
}

async function start() {
  try {
    const campaigns = await getJSON("/api/campaigns");
    if (!campaigns.length) {
      showError("This database holds no campaign yet; this page fills in once one starts.");
      setTimeout(start, POLL_MS);
      return;
    }
    const select = $("campaign");
    select.replaceChildren(...campaigns.map((c) => el("option", { value: c.id, text: `${c.name} (${c.problem})` })));
    state.campaign = campaigns[campaigns.length - 1].id;
    select.value = state.campaign;
    select.addEventListener("change", () => {
      state.campaign = Number(select.value);
      state.lastSeen = undefined;
      location.hash = "#/";
      refreshOverview();
    });
  } catch (error) {
    showError(error.message);
    return;
  }
  $("rank").addEventListener("change", () => {
    state.rank = $("rank").value;
    $("weights-box").hidden = state.rank !== "weights";
    loadTop();
  });
  $("weights").addEventListener("change", loadTop);
  $("rows").addEventListener("change", loadTop);
  window.addEventListener("hashchange", route);
  route();
  poll();
}

document.addEventListener("DOMContentLoaded", start);
