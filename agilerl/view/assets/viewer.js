// agilerl view: the page's script. Reads the JSON in #data, draws the charts (SVG) and the
// samples; served (--serve), it polls the server for new rows and reads whole steps from it.
// Every text from a run goes in through textContent: nothing in a record is ever markup.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("data").textContent);
  const RUNS = DATA.runs;
  const COLORS = ["#1f6feb", "#d9480f", "#2b8a3e", "#862e9c", "#c2255c", "#5c940d"];
  const PAGE = 40; // samples shown at once in a list; "more" shows the next
  const SVGNS = "http://www.w3.org/2000/svg";
  const FILTERS = [
    ["groups", "groups, as GRPO compared them"],
    ["lowest", "lowest reward first"],
    ["highest", "highest reward first"],
    ["failed_tool", "failed tool calls"],
    ["truncated", "truncated episodes"],
    ["error", "failed episodes"],
  ];

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value);
    }
    for (const child of children) if (child != null) node.append(child);
    return node;
  }
  function svg(tag, attrs) {
    const node = document.createElementNS(SVGNS, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    return node;
  }
  function fmt(value) {
    if (value == null || Number.isNaN(value)) return "–";
    if (typeof value !== "number") return String(value);
    const a = Math.abs(value);
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return value.toExponential(2);
    return String(Math.round(value * 1000) / 1000);
  }

  // ---------- charts ----------
  const FIRST = [
    ["reward", (k) => k === "train/reward" || k === "eval/reward"],
    ["reward components", (k) => k.startsWith("reward/")],
    ["loss", (k) => k === "train/loss" || k === "eval/loss"],
    ["staleness", (k) => k.startsWith("rollout/staleness")],
    ["queue depth", (k) => k === "rollout/queue_depth"],
    ["judge", (k) => k.startsWith("judge/")],
    ["tool calls", (k) => k.startsWith("tools/")],
    ["accuracy", (k) => k === "eval/accuracy"],
  ];

  function numericKeys() {
    const keys = new Set();
    for (const run of RUNS)
      for (const row of run.metrics)
        for (const [key, value] of Object.entries(row)) if (key !== "step" && typeof value === "number") keys.add(key);
    return [...keys].sort();
  }

  function series(run, key) {
    const points = [];
    for (const row of run.metrics) if (typeof row[key] === "number" && typeof row.step === "number") points.push([row.step, row[key]]);
    if (points.length <= 1500) return points;
    const every = points.length / 1500; // a long run: evenly thinned, the last point kept
    const out = [];
    for (let i = 0; i < 1500; i++) out.push(points[Math.floor(i * every)]);
    out.push(points[points.length - 1]);
    return out;
  }

  function chart(title, keys) {
    const W = 420, H = 210, L = 52, R = 10, T = 10, B = 34;
    const lines = [];
    RUNS.forEach((run, r) => keys.forEach((key, k) => {
      const points = series(run, key);
      if (points.length) lines.push({ run, r, key, k, points });
    }));
    if (!lines.length) return null;
    const all = lines.flatMap((l) => l.points);
    let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
    let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
    const box = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": title });
    box.append(svg("rect", { x: L, y: T, width: W - L - R, height: H - T - B, class: "plot" }));
    for (const y of [y0, (y0 + y1) / 2, y1]) {
      box.append(svg("line", { x1: L, x2: W - R, y1: sy(y), y2: sy(y), class: "grid" }));
      const label = svg("text", { x: L - 4, y: sy(y) + 4, class: "tick", "text-anchor": "end" });
      label.textContent = fmt(y);
      box.append(label);
    }
    for (const x of [x0, x1]) {
      const label = svg("text", { x: sx(x), y: H - B + 14, class: "tick", "text-anchor": "middle" });
      label.textContent = fmt(x);
      box.append(label);
    }
    const axis = svg("text", { x: (L + W - R) / 2, y: H - 4, class: "axis", "text-anchor": "middle" });
    axis.textContent = "step";
    box.append(axis);
    const legend = el("div", { class: "legend" });
    for (const line of lines) {
      const color = COLORS[(line.r * keys.length + line.k) % COLORS.length];
      const dashed = RUNS.length > 1 && line.r > 0 ? "5 3" : "";
      const d = line.points.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
      box.append(svg("path", { d, class: "line", stroke: color, "stroke-dasharray": dashed }));
      if (line.points.length <= 60 || line.key.startsWith("eval/"))
        for (const p of line.points) {
          const dot = svg("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.6, fill: color, class: "dot" });
          const tip = svg("title");
          tip.textContent = `${line.key} at step ${p[0]}: ${fmt(p[1])}`;
          dot.append(tip);
          dot.addEventListener("click", () => pickStepEverywhere(p[0]));
          box.append(dot);
        }
      const name = RUNS.length > 1 ? `${line.run.name}: ${line.key}` : line.key;
      legend.append(el("span", { class: "key" }, el("i", { style: `background:${color}` }), name));
    }
    return el("figure", { class: "card" }, el("figcaption", { text: title }), box, legend);
  }

  function evalChart(run, r) {
    // an eval file logs no metrics over steps: its reward by task, as bars
    const byTask = new Map();
    for (const rec of run.records) {
      if (typeof rec.reward !== "number") continue;
      const t = byTask.get(rec.group) || [];
      t.push(rec.reward);
      byTask.set(rec.group, t);
    }
    if (!byTask.size) return null;
    const W = 420, H = 210, L = 52, B = 34, T = 10;
    const tasks = [...byTask.keys()].sort((a, b) => a - b);
    const means = tasks.map((t) => byTask.get(t).reduce((a, b) => a + b, 0) / byTask.get(t).length);
    const top = Math.max(1e-9, ...means), low = Math.min(0, ...means);
    const bw = (W - L - 10) / tasks.length;
    const sy = (y) => T + (1 - (y - low) / (top - low)) * (H - T - B);
    const box = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": "reward by task" });
    box.append(svg("rect", { x: L, y: T, width: W - L - 10, height: H - T - B, class: "plot" }));
    tasks.forEach((t, i) => {
      const bar = svg("rect", { x: L + i * bw + 1, width: Math.max(1, bw - 2), y: sy(Math.max(0, means[i])), height: Math.abs(sy(means[i]) - sy(0)), fill: COLORS[r % COLORS.length] });
      const tip = svg("title");
      tip.textContent = `task ${t}: mean reward ${fmt(means[i])} over ${byTask.get(t).length}`;
      bar.append(tip);
      box.append(bar);
    });
    for (const y of [low, top]) {
      const label = svg("text", { x: L - 4, y: sy(y) + 4, class: "tick", "text-anchor": "end" });
      label.textContent = fmt(y);
      box.append(label);
    }
    const axis = svg("text", { x: (L + W) / 2, y: H - 4, class: "axis", "text-anchor": "middle" });
    axis.textContent = "task";
    box.append(axis);
    return el("figure", { class: "card" }, el("figcaption", { text: `${run.name}: mean reward by task` }), box);
  }

  function drawCharts() {
    const grid = document.getElementById("chart-grid");
    const rest = document.getElementById("chart-grid-all");
    grid.replaceChildren();
    rest.replaceChildren();
    const keys = numericKeys();
    const used = new Set();
    for (const [title, test] of FIRST) {
      const mine = keys.filter(test);
      mine.forEach((k) => used.add(k));
      const card = mine.length ? chart(title, mine) : null;
      if (card) grid.append(card);
    }
    RUNS.forEach((run, r) => { if (run.kind === "eval") { const c = evalChart(run, r); if (c) grid.append(c); } });
    for (const key of keys) if (!used.has(key)) { const c = chart(key, [key]); if (c) rest.append(c); }
    if (!grid.children.length && !rest.children.length) grid.append(el("p", { class: "note", text: "No metrics logged yet." }));
    document.getElementById("more-charts").hidden = !rest.children.length;
  }

  // ---------- samples ----------
  const views = [];

  function stepsOf(run) { return run.steps.map((s) => s[0]); }

  function recordsOf(view, step) {
    if (view.scope === "all") return view.run.records;
    return view.loaded.get(step) || view.run.records.filter((r) => r.step === step);
  }

  function ordered(view, records) {
    const f = view.filter;
    const rewardOf = (r) => (typeof r.reward === "number" ? r.reward : NaN);
    if (f === "lowest") return [...records].sort((a, b) => (rewardOf(a) - rewardOf(b)) || 0);
    if (f === "highest") return [...records].sort((a, b) => (rewardOf(b) - rewardOf(a)) || 0);
    if (f === "groups") return [...records].sort((a, b) => (a.step - b.step) || (a.group - b.group) || ((a.index || 0) - (b.index || 0)) || (a.sample - b.sample));
    return records.filter((r) => (r.flags || []).includes(f));
  }

  function turnNode(view, rec, turn) {
    const role = turn.role;
    const who = role === "model" ? "model" : role === "prompt" ? "prompt (env)" : "env";
    const head = el("div", { class: "turn-head" }, el("span", { class: "who", text: who }));
    if (turn.turn != null && turn.turn >= 0) head.append(el("span", { class: "muted", text: ` turn ${turn.turn}` }));
    if (turn.start != null) head.append(el("span", { class: "muted", text: ` · tokens ${turn.start}–${turn.end}` }));
    if (role === "model" && typeof turn.reward === "number") head.append(el("span", { class: "reward-chip", text: `reward ${fmt(turn.reward)}` }));
    if (role === "model" && rec.versions && turn.start != null) {
      const made = rec.versions.slice(turn.start, turn.end).filter((v) => v >= 0);
      if (made.length) {
        const lag = made.map((v) => rec.step - 1 - v);
        head.append(el("span", { class: "muted", text: ` · version ${Math.min(...made)}${Math.max(...made) !== Math.min(...made) ? "–" + Math.max(...made) : ""}, staleness ${Math.max(...lag)}` }));
      }
    }
    const box = el("div", { class: `turn ${role}` }, head);
    if (turn.images && turn.images.length) {
      const pics = el("div", { class: "pictures" });
      for (const image of turn.images) {
        const src = view.images[image.file];
        if (src) pics.append(el("img", { src, alt: `picture ${image.width}x${image.height}`, title: `${image.width}x${image.height}` }));
        else pics.append(el("span", { class: "muted", text: `[picture ${image.width}x${image.height}, not in this page]` }));
      }
      box.append(pics);
    }
    box.append(el("pre", { class: "text", text: turn.text || "" }));
    if (turn.tool_calls && turn.tool_calls.length) {
      const list = el("ul", { class: "calls" });
      for (const call of turn.tool_calls) {
        const ok = (call.status || "ok") === "ok";
        const args = typeof call.arguments === "string" ? call.arguments : JSON.stringify(call.arguments);
        const item = el("li", {}, el("span", { class: `status ${ok ? "ok" : "bad"}`, text: call.status || "ok" }),
          el("code", { text: `${call.name ?? "?"}(${args ?? ""})` }));
        if (call.error) item.append(el("span", { class: "muted", text: ` ${call.error}` }));
        if (call.result != null && ok) item.append(el("span", { class: "muted", text: ` → ${String(call.result).slice(0, 200)}` }));
        list.append(item);
      }
      box.append(list);
    }
    return box;
  }

  function tokensNode(rec) {
    // the exact ids, the model's apart from the env's; a generated token shows its version
    const box = el("div", { class: "tokens" });
    const ids = rec.token_ids || [], mask = rec.mask || [];
    const n = Math.min(ids.length, 20000);
    for (let i = 0; i < n; i++) {
      const lag = mask[i] && rec.versions ? rec.step - 1 - rec.versions[i] : 0;
      const span = el("span", { class: (mask[i] ? "m" : "e") + (lag > 0 ? " stale" : ""), text: String(ids[i]) });
      span.title = mask[i] && rec.versions ? `#${i} version ${rec.versions[i]}, staleness ${lag}` : `#${i}`;
      box.append(span, " ");
    }
    if (ids.length > n) box.append(el("span", { class: "muted", text: `… ${ids.length - n} more` }));
    return box;
  }

  function sampleNode(view, rec, open) {
    const badges = el("span", { class: "badges" });
    for (const flag of rec.flags || []) badges.append(el("span", { class: `badge ${flag}`, text: flag.replace("_", " ") }));
    if (rec.passed === true) badges.append(el("span", { class: "badge passed", text: "passed" }));
    const label = rec.samples > 1 ? ` · sample ${rec.sample + 1}/${rec.samples}` : "";
    const summary = el("summary", {},
      el("span", { class: "reward", text: `reward ${fmt(rec.reward)}` }),
      el("span", { class: "muted", text: ` · ${view.run.kind === "eval" ? "task" : "group"} ${rec.group} · ${rec.episode}${label}` }),
      badges);
    const body = el("div", { class: "sample-body" });
    const facts = el("dl", { class: "facts" });
    const fact = (k, v) => { if (v != null && v !== "") facts.append(el("dt", { text: k }), el("dd", { text: v })); };
    fact("step", view.run.kind === "eval" ? null : String(rec.step));
    fact("rewards per turn", (rec.rewards || []).map(fmt).join(", "));
    for (const [name, value] of Object.entries(rec.reward_components || {})) fact(`reward part: ${name}`, fmt(value));
    if (rec.staleness) fact("staleness", `mean ${fmt(rec.staleness.mean)}, max ${fmt(rec.staleness.max)}`);
    fact("ended", rec.terminated ? "terminated" : rec.truncated ? `truncated${rec.truncated_by ? " (" + rec.truncated_by + ")" : ""}` : "");
    fact("error", rec.error);
    fact("seed", rec.seed == null ? null : String(rec.seed));
    fact("row", rec.row_index == null ? null : String(rec.row_index));
    body.append(facts);
    for (const turn of rec.turns || []) body.append(turnNode(view, rec, turn));
    if (rec.token_ids) {
      const holder = el("div");
      const button = el("button", { type: "button", class: "tokens-button", text: `show the ${rec.token_ids.length} token ids`,
        onclick: () => { holder.replaceChildren(tokensNode(rec)); button.remove(); } });
      body.append(button, holder);
    }
    const node = el("details", { class: "sample" }, summary, body);
    if (open) node.open = true;
    return node;
  }

  function drawView(view) {
    const run = view.run;
    const steps = stepsOf(run);
    const list = view.list;
    list.replaceChildren();
    const step = view.step;
    const records = ordered(view, recordsOf(view, step));
    const info = run.steps.find((s) => s[0] === step);
    const shownCount = recordsOf(view, step).length;
    let head = "";
    if (run.kind === "eval") head = `${run.total} episodes`;
    else if (view.scope === "all") head = `all steps: ${run.records.length} records in this page`;
    else if (info) head = `step ${step}: ${info[1]} samples, mean reward ${fmt(info[2])}` + (shownCount < info[1] ? ` (${shownCount} in this page${DATA.live ? ", loading the rest" : "; agilerl view --serve reads them all"})` : "");
    else head = steps.length ? `step ${step}: no records` : "no records yet";
    view.status.textContent = head;
    let groupOf = null;
    const limit = view.shown;
    records.slice(0, limit).forEach((rec, i) => {
      if (view.filter === "groups" && view.scope !== "all" && rec.group !== groupOf) {
        groupOf = rec.group;
        const members = records.filter((r) => r.group === rec.group && typeof r.reward === "number");
        const mean = members.reduce((a, r) => a + r.reward, 0) / Math.max(1, members.length);
        list.append(el("h4", { class: "group", text: `${run.kind === "eval" ? "task" : "group"} ${rec.group} · mean reward ${fmt(mean)} · ${members.length} scored` }));
      }
      list.append(sampleNode(view, rec, i < 4));
    });
    if (!records.length) list.append(el("p", { class: "note", text: "No sample matches." }));
    if (records.length > limit)
      list.append(el("button", { type: "button", text: `show ${Math.min(PAGE, records.length - limit)} more of ${records.length - limit}`,
        onclick: () => { view.shown += PAGE; drawView(view); } }));
    view.number.value = step;
    if (DATA.live && run.kind !== "eval" && view.scope !== "all" && info && !view.loaded.has(step) && shownCount < info[1]) loadStep(view, step);
  }

  function pick(view, step) {
    const steps = stepsOf(view.run);
    if (!steps.length) return;
    let best = steps[0];
    for (const s of steps) if (Math.abs(s - step) < Math.abs(best - step)) best = s;
    view.step = best;
    view.shown = PAGE;
    drawView(view);
  }
  function pickStepEverywhere(step) { for (const view of views) if (view.run.kind !== "eval") pick(view, step); }

  function buildView(run, r) {
    const steps = stepsOf(run);
    const view = { run, step: steps.length ? steps[steps.length - 1] : 0, filter: "groups", scope: "step", shown: PAGE, loaded: new Map(), images: { ...run.images } };
    const number = el("input", { type: "number", class: "step-number", "aria-label": "step" });
    number.addEventListener("change", () => pick(view, Number(number.value)));
    const move = (d) => { const s = stepsOf(run); const i = s.indexOf(view.step); if (i + d >= 0 && i + d < s.length) pick(view, s[i + d]); };
    const filter = el("select", { "aria-label": "order and filter" });
    for (const [value, label] of FILTERS) filter.append(el("option", { value, text: label }));
    filter.addEventListener("change", () => { view.filter = filter.value; view.shown = PAGE; drawView(view); });
    const scope = el("select", { "aria-label": "which steps" }, el("option", { value: "step", text: "this step" }), el("option", { value: "all", text: "every step in this page" }));
    scope.addEventListener("change", () => { view.scope = scope.value; view.shown = PAGE; drawView(view); });
    const controls = el("div", { class: "controls" });
    if (run.kind !== "eval")
      controls.append(el("button", { type: "button", text: "◀", title: "previous step", onclick: () => move(-1) }),
        el("label", {}, "step ", number), el("button", { type: "button", text: "▶", title: "next step", onclick: () => move(1) }),
        el("button", { type: "button", text: "latest", onclick: () => pick(view, Infinity) }), scope);
    controls.append(filter);
    view.number = number;
    view.status = el("p", { class: "step-status" });
    view.list = el("div", { class: "list" });
    const note = run.records.length < run.total ? ` · ${run.records.length} of ${run.total} records in this page (sampled: the lowest and highest reward and the flagged ones of each step first)` : ` · ${run.total} records`;
    const column = el("div", { class: "run", style: `border-top-color:${COLORS[r % COLORS.length]}` },
      el("h3", { text: run.name }), el("p", { class: "muted", text: `${run.path}${note}` }), controls, view.status, view.list);
    views.push(view);
    drawView(view);
    return column;
  }

  // ---------- served: new rows, whole steps ----------
  async function loadStep(view, step) {
    view.loaded.set(step, view.loaded.get(step) || view.run.records.filter((r) => r.step === step));
    try {
      const reply = await fetch(`api/step?run=${RUNS.indexOf(view.run)}&step=${step}`);
      if (!reply.ok) return;
      const got = await reply.json();
      Object.assign(view.images, got.images);
      view.loaded.set(step, got.records);
      if (view.step === step) drawView(view);
    } catch (e) { /* the server stopped: the page keeps what it has */ }
  }

  async function poll() {
    try {
      const since = RUNS.map((run) => [run.metrics.length, run.total]);
      const reply = await fetch(`api/poll?since=${encodeURIComponent(JSON.stringify(since))}`);
      if (reply.ok) {
        const got = await reply.json();
        let changed = false;
        got.runs.forEach((update, r) => {
          const run = RUNS[r];
          if (update.reset) { run.metrics = []; run.records = []; views[r].loaded.clear(); }
          if (update.metrics.length || update.reset) { run.metrics = run.metrics.concat(update.metrics); changed = true; }
          if (update.total !== run.total || update.reset) {
            const latest = views[r].step === (stepsOf(run).slice(-1)[0] ?? views[r].step);
            run.total = update.total;
            run.steps = update.steps;
            views[r].loaded.clear();
            if (latest) views[r].step = stepsOf(run).slice(-1)[0] ?? 0;
            drawView(views[r]);
            changed = true;
          }
        });
        if (changed) drawCharts();
        document.getElementById("summary").dataset.polled = String(Date.now());
      }
    } catch (e) { /* the server stopped: try again later */ }
    setTimeout(poll, 2000);
  }

  // ---------- the page ----------
  const kinds = RUNS.map((r) => r.kind === "eval" ? `${r.name} (eval, ${r.total} episodes)` : `${r.name} (${r.metrics.length} metrics rows, ${r.total} samples recorded)`);
  document.getElementById("summary").textContent = kinds.join(" · ") + (DATA.live ? " · live: new rows appear as the run writes them" : "");
  drawCharts();
  const runs = document.getElementById("runs");
  runs.style.gridTemplateColumns = `repeat(${RUNS.length}, minmax(0, 1fr))`;
  RUNS.forEach((run, r) => runs.append(buildView(run, r)));
  if (DATA.live) setTimeout(poll, 2000);
})();
