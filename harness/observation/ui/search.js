// The search itself: the campaign's genealogy (#/tree) and, on a program's page, its story (what
// its rollout was shown, what it wrote, what became of each candidate, the group's other
// rollouts, the evaluation as text). Loaded after app.js and uses its helpers (el, svg, $,
// getJSON, query, fmt, fact, showError, state). Database text reaches the page only through
// textContent, as in app.js.
"use strict";

const tree = { data: null, color: null, limit: 1500 };
const PATH_COLORS = ["#b3362f", "#2f6fb3", "#2c7a3f", "#8e44ad", "#d9822b"];
const ISLAND_COLORS = ["#2f6fb3", "#d9822b", "#2c7a3f", "#8e44ad", "#b3362f", "#1b9e9e", "#7f6a00", "#c2185b"];
// A sequential scale (dark blue -> teal -> yellow) for scores and policy versions.
const RAMP = [[38, 52, 120], [32, 120, 150], [60, 170, 110], [200, 210, 60], [250, 200, 30]];

function ramp(t) {
  const u = Math.min(1, Math.max(0, Number.isFinite(t) ? t : 0)) * (RAMP.length - 1);
  const i = Math.min(RAMP.length - 2, Math.floor(u)), f = u - i;
  const c = RAMP[i].map((v, k) => Math.round(v + (RAMP[i + 1][k] - v) * f));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

// ---------------------------------------------------------------------------------------------
// Genealogy page

async function showTree() {
  $("overview-page").hidden = true;
  $("program-page").hidden = true;
  $("tree-page").hidden = false;
  $("live").textContent = "the genealogy: updates when you open it or press redraw";
  $("live").className = "live";
  try {
    tree.data = await getJSON(`/api/tree?${query({ campaign: state.campaign, limit: tree.limit })}`);
    treeControls();
    drawTree();
    showError("");
  } catch (error) {
    showError(error.message);
  }
}

function treeControls() {
  const d = tree.data;
  const choices = [...d.objectives.map((name) => [`objective:${name}`, name]),
    ["version", "policy version that sampled it"], ["island", "island"]];
  if (!choices.some(([value]) => value === tree.color)) tree.color = choices[0][0];
  const select = $("tree-color");
  select.replaceChildren(...choices.map(([value, text]) => el("option", { value, text })));
  select.value = tree.color;
  $("tree-limit").value = String(tree.limit);
  const drawn = d.sampled ? `Drawn: ${fmt(d.shown)} of ${fmt(d.total)} programs, ${d.rule}.`
    : `${fmt(d.total)} programs, all drawn.`;
  $("tree-summary").textContent = `${drawn} Draft edges: ${fmt(d.draft_edges.length)} drawn of the ` +
    `${fmt(d.drafts_total)} that drawn programs were shown.`;
}

// The colour of a node under the chosen encoding, and the legend that explains it.
function colouring(d) {
  const nodes = d.nodes;
  if (tree.color === "island") {
    return { fill: (n) => ISLAND_COLORS[n.island % ISLAND_COLORS.length],
      legend: d.islands.map((i) => [ISLAND_COLORS[i % ISLAND_COLORS.length], `island ${i}`]) };
  }
  if (tree.color === "version") {
    const top = Math.max(0, ...d.versions);
    const legend = [["#c5cbd3", "seed or migrant"], [ramp(0), "version 0 (base weights)"]];
    if (top > 0) legend.push([ramp(1), `version ${top}`]);
    return { fill: (n) => (n.version < 0 ? "#c5cbd3" : ramp(n.version / Math.max(1, top))), legend };
  }
  const j = d.objectives.indexOf(tree.color.slice("objective:".length));
  const values = nodes.filter((n) => n.valid).map((n) => n.scores[j]);
  const lo = values.length ? Math.min(...values) : 0, hi = values.length ? Math.max(...values) : 1;
  const span = hi > lo ? hi - lo : 1;
  return { fill: (n) => (n.valid ? ramp((n.scores[j] - lo) / span) : "#fff"),
    legend: [[ramp(0), fmt(lo)], [ramp(1), fmt(hi)], ["#fff", "not valid (no score)"]] };
}

function drawTree() {
  const d = tree.data;
  const box = $("tree");
  if (!d.nodes.length) {
    box.replaceChildren(el("p", { text: "No program yet." }));
    $("tree-legend").replaceChildren();
    return;
  }
  const leaves = Math.max(...d.nodes.map((n) => n.x)) + 1;
  const generations = Math.max(...d.nodes.map((n) => n.generation)) + 1;
  const available = Math.max(600, box.clientWidth - 20);
  const dx = Math.min(28, Math.max(5, (available - 70) / leaves));
  const dy = generations > 40 ? 18 : 40;
  const left = 60, top = 16;
  const width = left + leaves * dx + 20, height = top + generations * dy + 10;
  const X = (n) => left + n.x * dx, Y = (n) => top + n.generation * dy;
  const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "tree" });
  const step = Math.ceil(generations / 20);
  for (let g = 0; g < generations; g += step) {
    root.append(svg("line", { class: "grid", x1: left - 6, x2: width, y1: top + g * dy, y2: top + g * dy }));
    root.append(svg("text", { x: 4, y: top + g * dy + 4 }, `gen ${g}`));
  }
  const byId = new Map(d.nodes.map((n) => [n.id, n]));
  const edges = svg("g", {}), drafts = svg("g", {}), paths = svg("g", {}), dots = svg("g", {});
  for (const n of d.nodes) {
    const p = byId.get(n.parent);
    if (!p) continue;
    const cls = n.skipped ? "tree-edge skips" : n.origin === "migration" ? "tree-edge migration" : "tree-edge";
    const mid = (Y(p) + Y(n)) / 2;
    const edge = svg("path", { class: cls, d: `M${X(p)},${Y(p)}V${mid}H${X(n)}V${Y(n)}` });
    if (n.skipped) edge.append(svg("title", {}, `skips ${n.skipped} program(s) not drawn`));
    edges.append(edge);
  }
  if ($("tree-drafts").checked) {
    for (const e of d.draft_edges) {
      const a = byId.get(e.from), b = byId.get(e.to);
      if (a && b) drafts.append(svg("line", { class: "tree-draft", x1: X(a), y1: Y(a), x2: X(b), y2: Y(b) }));
    }
  }
  const onPath = new Set();
  Object.entries(d.best).forEach(([name, best], j) => {
    const points = best.path.map((id) => byId.get(id)).filter(Boolean);
    const shift = (j - 1) * 2;
    const line = points.map((n, i) => `${i ? "L" : "M"}${X(n) + shift},${Y(n)}`).join("");
    const colour = PATH_COLORS[j % PATH_COLORS.length];
    paths.append(svg("path", { class: "tree-best", d: line, stroke: colour }));
    best.path.forEach((id) => onPath.add(id));
  });
  const { fill, legend } = colouring(d);
  for (const n of d.nodes) {
    const dot = svg("circle", { class: `tree-node${n.valid ? "" : " invalid"}${onPath.has(n.id) ? " on-path" : ""}`,
      cx: X(n), cy: Y(n), r: onPath.has(n.id) ? 5 : 3.5, fill: fill(n), "data-id": n.id });
    const scores = d.objectives.map((name, j) => `${name} ${n.valid ? fmt(n.scores[j]) : "–"}`).join(", ");
    const version = n.version < 0 ? n.origin : `policy version ${n.version}`;
    dot.append(svg("title", {}, `program ${n.id} · gen ${n.generation} · island ${n.island} · ${version}\n${scores}`));
    dot.addEventListener("click", () => { location.hash = `#/program/${n.id}`; });
    dots.append(dot);
  }
  root.append(edges, drafts, paths, dots);
  box.replaceChildren(root);
  treeLegend(d, legend);
}

// The page's CSP refuses style attributes; a property set from script is allowed.
function swatch(colour, text, cls = "dot") {
  const mark = el("i", { class: cls });
  mark.style.background = colour;
  return el("span", {}, mark, document.createTextNode(text));
}

function treeLegend(d, legend) {
  const colours = el("div", { class: "legend" }, el("b", { text: "colour:" }), ...legend.map(([c, t]) => swatch(c, t)));
  const lines = el("div", { class: "legend" }, el("b", { text: "edges:" }),
    swatch("#677284", "parent", "bar"), swatch("#d9822b", "migration (copied from another island)", "bar"),
    swatch("#9aa3b1", "skips programs not drawn (dotted)", "bar"),
    swatch("#8fb3dd", "draft shown in the prompt (dashed)", "bar"));
  const best = el("div", { class: "legend best" }, el("b", { text: "best path:" }),
    ...Object.entries(d.best).map(([name, b], j) => {
      const item = swatch(PATH_COLORS[j % PATH_COLORS.length], "", "bar");
      const link = el("a", { href: `#/program/${b.id}`, text: `program ${b.id}` });
      const tail = b.is_seed ? " (still the seed: nothing beat it)" : `, ${b.path.length - 1} step(s) from its root`;
      item.append(document.createTextNode(`${name} ${fmt(b.score)}: `), link, document.createTextNode(tail));
      return item;
    }));
  $("tree-legend").replaceChildren(colours, lines, best);
}

function setUpTree() {
  $("tree-color").addEventListener("change", () => { tree.color = $("tree-color").value; drawTree(); });
  $("tree-drafts").addEventListener("change", drawTree);
  $("tree-limit").addEventListener("change", () => { tree.limit = Number($("tree-limit").value); showTree(); });
  $("tree-redraw").addEventListener("click", showTree);
}

document.addEventListener("DOMContentLoaded", setUpTree);

// ---------------------------------------------------------------------------------------------
// A program's story

const OUTCOME_WORDS = { new: "new program", duplicate: "repeat, not evaluated", unparsed: "unparsed" };

function programLink(id) {
  return id === null || id === undefined ? document.createTextNode("–") : el("a", { href: `#/program/${id}`, text: String(id) });
}

function candidateRows(candidates, current) {
  return candidates.map((c) => {
    const what = OUTCOME_WORDS[c.outcome] || String(c.outcome);
    const status = c.status ? `${c.status}${c.error ? `: ${c.error}` : ""}` : "";
    const scores = c.scores ? Object.entries(c.scores).map(([k, v]) => `${k} ${fmt(v)}`).join(", ") : "";
    const row = el("tr", { class: c.program_id === current ? "current" : "" },
      el("td", { text: String(c.index) }), el("td", { class: "text", text: what + (c.lazy ? " (lazy)" : "") }),
      el("td", {}, programLink(c.program_id)), el("td", { class: "text", text: status }),
      el("td", { class: "text", text: scores }), el("td", { class: "text", text: c.reason || "" }));
    return row;
  });
}

async function renderStory(id) {
  const story = await getJSON(`/api/programs/${id}/story`);
  if (location.hash !== `#/program/${id}`) return;  // the user moved on while it loaded
  const r = story.rollout;
  $("story").hidden = !r;
  if (!r) return;
  const mine = r.rollouts.find((x) => x.this);
  $("story-version").replaceChildren(fact("sampled by", mine.policy_version === 0
    ? "policy version 0 (the base weights)" : `policy version ${mine.policy_version}`));
  $("story-prompt").replaceChildren(...r.prompt.map((m, i) => {
    const box = el("details", m.role === "user" ? { open: "" } : {},
      el("summary", { text: `${m.role} message (${fmt(m.content.length)} characters)` }),
      el("pre", { class: "code wrap", text: m.content }));
    box.dataset.index = String(i);
    return box;
  }));
  $("completion").textContent = mine.completion;
  $("story-parse").textContent = mine.parse_error ? `parse: ${mine.parse_status}: ${mine.parse_error}` : "";
  $("story-candidates").tBodies[0].replaceChildren(...candidateRows(mine.candidates, id));
  const others = r.rollouts.filter((x) => !x.this);
  $("story-group").tBodies[0].replaceChildren(...others.map((x) => {
    const written = el("td", { class: "text" });
    x.candidates.forEach((c, k) => {
      if (k) written.append(document.createTextNode(" · "));
      written.append(programLink(c.program_id), document.createTextNode(` ${c.outcome}${c.lazy ? " (lazy)" : ""}`));
    });
    if (!x.candidates.length) written.append(document.createTextNode(x.parse_error || x.parse_status));
    return el("tr", {}, el("td", { text: String(x.position) }), el("td", { text: String(x.policy_version) }),
      el("td", { text: fmt(x.num_tokens) }), el("td", { class: "text", text: x.finish_reason }),
      el("td", { class: "text", text: x.parse_status }), written);
  }));
}

// The evaluation as text: the error, each stage's output (a traceback as a code block), then
// any other numbers the evaluator reported.
function renderEvaluation(p) {
  const parts = [];
  if (p.error) parts.push(el("p", { class: "error", text: p.error }));
  const metrics = p.metrics && typeof p.metrics === "object" ? p.metrics : {};
  const stages = metrics.artifacts && typeof metrics.artifacts === "object" ? metrics.artifacts : {};
  for (const [stage, out] of Object.entries(stages)) {
    if (!out || typeof out !== "object") continue;
    parts.push(el("h4", { text: `${stage}${typeof out.seconds === "number" ? ` (${fmt(out.seconds, 2)} s)` : ""}` }));
    for (const stream of ["stdout", "stderr"]) {
      if (out[stream]) parts.push(el("div", { class: "stream", text: stream }), el("pre", { class: "code", text: out[stream] }));
    }
    if (Array.isArray(out.warnings) && out.warnings.length) {
      parts.push(el("ul", {}, ...out.warnings.map((w) => el("li", { text: String(w) }))));
    }
    if (!out.stdout && !out.stderr) parts.push(el("p", { class: "muted", text: "no output" }));
  }
  const rest = Object.entries(metrics).filter(([k]) => k !== "artifacts");
  if (rest.length) {
    parts.push(el("table", { class: "metrics" }, el("tbody", {}, ...rest.map(([k, v]) =>
      el("tr", {}, el("td", { class: "text", text: k }),
        el("td", { class: "text", text: typeof v === "object" ? JSON.stringify(v) : String(v) }))))));
  }
  if (!parts.length) parts.push(el("p", { class: "muted", text: "no error and no output recorded" }));
  $("program-feedback").replaceChildren(...parts);
}
