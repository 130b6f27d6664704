// eqsat plan report: lays out each program with ELK (inlined above) and draws it as SVG, grouped into collapsible
// clusters by jax name stack, with pan (drag), zoom (wheel), a tooltip per node and the changed regions highlighted.
"use strict";
const CHAR_W = 7.2, LINE_H = 15, PAD = 8;
const elk = new ELK();
const NS = "http://www.w3.org/2000/svg";

function el(tag, attrs, parent) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

function text(parent, x, y, lines, attrs) {
  lines.forEach((line, k) => {
    const t = el("text", {x, y: y + k * LINE_H, ...attrs}, parent);
    t.textContent = line;
  });
}

function boxSize(lines) {
  return {width: Math.max(...lines.map((l) => l.length)) * CHAR_W + 2 * PAD, height: lines.length * LINE_H + PAD};
}

function prefixes(cluster) {
  const parts = cluster ? cluster.split("/") : [];
  return parts.map((_, k) => parts.slice(0, k + 1).join("/"));
}

class Pane {
  constructor(root, data) {
    this.root = root;
    this.data = data;
    this.collapsed = new Set(data.collapsed);
    this.svg = el("svg", {class: "graph", width: "100%", height: "100%"}, root);
    this.view = el("g", {}, this.svg);
    this.scale = 1; this.tx = 0; this.ty = 0;
    this.panZoom();
  }

  // long chains (a model's layers) wrap into rows of about the pane's shape instead of one tall column
  wrapping() {
    const aspect = (this.root.clientWidth || 800) / (this.root.clientHeight || 600);
    return {"elk.layered.wrapping.strategy": "MULTI_EDGE", "elk.aspectRatio": aspect.toFixed(2)};
  }

  // the drawn item standing for node i: its deepest visible cluster, collapsed, or itself
  shownAs(cluster, id) {
    for (const p of prefixes(cluster)) if (this.collapsed.has(p)) return "c:" + p;
    return id;
  }

  async layout() {
    const d = this.data, items = new Map(), clusters = new Map();
    const top = {id: "root", children: [], edges: [], layoutOptions: {
      "elk.algorithm": "layered", "elk.direction": "DOWN", "elk.hierarchyHandling": "INCLUDE_CHILDREN",
      "elk.layered.spacing.nodeNodeBetweenLayers": "28", "elk.spacing.nodeNode": "14",
      "elk.edgeRouting": "SPLINES", ...this.wrapping()}};
    const container = (path) => {  // the ELK node holding items of this cluster, made on first use
      if (!path) return top;
      if (clusters.has(path)) return clusters.get(path);
      const parent = container(path.includes("/") ? path.slice(0, path.lastIndexOf("/")) : "");
      const title = path.slice(path.lastIndexOf("/") + 1);
      const c = {id: "k:" + path, children: [], title, path, layoutOptions: {...this.wrapping(),
        "elk.padding": `[top=${LINE_H + 10},left=8,bottom=8,right=8]`, "elk.nodeLabels.placement": "INSIDE"}};
      c.minWidth = title.length * CHAR_W + 20;
      c.layoutOptions["elk.nodeSize.minimum"] = `(${c.minWidth},20)`;
      c.layoutOptions["elk.nodeSize.constraints"] = "MINIMUM_SIZE";
      parent.children.push(c);
      clusters.set(path, c);
      return c;
    };
    d.nodes.forEach((n, i) => {
      const key = this.shownAs(n.cluster, "n:" + i);
      if (items.has(key)) return;
      let item;
      if (key.startsWith("c:")) {
        const path = key.slice(2), info = d.clusters[path] || {};
        const lines = [path.slice(path.lastIndexOf("/") + 1) + " ▸", ...(info.summary || [])];
        item = {id: key, lines, path, changed: info.changed, ...boxSize(lines)};
        container(path.includes("/") ? path.slice(0, path.lastIndexOf("/")) : "").children.push(item);
      } else {
        const lines = [n.label, n.type];
        item = {id: key, lines, node: n, ...boxSize(lines)};
        container(n.cluster).children.push(item);
      }
      items.set(key, item);
    });
    const seen = new Set();
    d.edges.forEach(([u, v]) => {
      const a = this.shownAs(d.nodes[u].cluster, "n:" + u), b = this.shownAs(d.nodes[v].cluster, "n:" + v);
      if (a === b || seen.has(a + ">" + b)) return;
      seen.add(a + ">" + b);
      top.edges.push({id: "e" + top.edges.length, sources: [a], targets: [b]});
    });
    this.laid = await elk.layout(top);
    this.render();
  }

  render() {
    this.view.replaceChildren();
    const offsets = new Map([["root", [0, 0]]]);
    const edgesLayer = el("g", {class: "edges"}, this.view);
    const walk = (node, x0, y0) => {
      for (const c of node.children || []) {
        const x = x0 + c.x, y = y0 + c.y;
        offsets.set(c.id, [x, y]);
        if (c.path !== undefined && c.children) this.drawCluster(c, x, y);
        else this.drawItem(c, x, y);
        if (c.children) walk(c, x, y);
      }
    };
    walk(this.laid, 0, 0);
    for (const e of this.laid.edges || []) {
      const [ox, oy] = offsets.get(e.container || "root") || [0, 0];
      for (const s of e.sections || []) {
        const pts = [s.startPoint, ...(s.bendPoints || []), s.endPoint].map((p) => `${p.x + ox},${p.y + oy}`);
        el("path", {d: "M" + pts.join(" L"), class: "edge", "marker-end": `url(#${this.root.id}-arrow)`}, edgesLayer);
      }
    }
    const defs = el("defs", {}, this.svg);
    const m = el("marker", {id: `${this.root.id}-arrow`, viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 6,
      markerHeight: 6, orient: "auto-start-reverse"}, defs);
    el("path", {d: "M0,0 L10,5 L0,10 z", fill: "#666"}, m);
    this.fit();
  }

  regionAttrs(path) {
    const regions = (this.data.clusters[path] || {}).regions || [];
    return regions.length ? {"data-regions": regions.join("|")} : {};
  }

  drawCluster(c, x, y) {
    const info = this.data.clusters[c.path] || {};
    const g = el("g", {class: "cluster" + (info.changed ? " changed" : ""), "data-path": c.path,
      ...this.regionAttrs(c.path)}, this.view);
    el("title", {}, g).textContent = `${c.path}${(info.summary || []).map((s) => "\n" + s).join("")}\n(click to collapse)`;
    el("rect", {x, y, width: c.width, height: c.height, rx: 6}, g);
    text(g, x + 6, y + LINE_H, [c.title + " ▾"], {class: "title"});
    g.addEventListener("click", (ev) => { ev.stopPropagation(); this.toggle(c.path); });
  }

  drawItem(item, x, y) {
    if (item.path !== undefined) {  // a collapsed cluster
      const g = el("g", {class: "collapsed" + (item.changed ? " changed" : ""), "data-path": item.path,
        ...this.regionAttrs(item.path)}, this.view);
      el("title", {}, g).textContent = `${item.path}\n${item.lines.slice(1).join("\n")}\n(click to expand)`;
      el("rect", {x, y, width: item.width, height: item.height, rx: 6}, g);
      text(g, x + PAD, y + LINE_H, item.lines, {});
      g.addEventListener("click", (ev) => { ev.stopPropagation(); this.toggle(item.path); });
      return;
    }
    const n = item.node;
    const g = el("g", {class: `node ${n.kind}` + (n.output ? " output" : "")}, this.view);
    el("title", {}, g).textContent = n.tip;
    el("rect", {x, y, width: item.width, height: item.height, rx: 4}, g);
    text(g, x + item.width / 2, y + LINE_H, item.lines, {"text-anchor": "middle"});
  }

  toggle(path) {
    if (this.collapsed.has(path)) this.collapsed.delete(path); else this.collapsed.add(path);
    this.layout();
  }

  apply() { this.view.setAttribute("transform", `translate(${this.tx},${this.ty}) scale(${this.scale})`); }

  fit(box) {
    const w = this.root.clientWidth, h = this.root.clientHeight;
    const b = box || {x: 0, y: 0, width: this.laid.width || 1, height: this.laid.height || 1};
    this.scale = Math.min(w / (b.width + 20), h / (b.height + 20), 2);
    this.tx = (w - b.width * this.scale) / 2 - b.x * this.scale;
    this.ty = (h - b.height * this.scale) / 2 - b.y * this.scale;
    this.apply();
  }

  focus(region) {  // zoom to the drawn item that holds a region
    const g = [...this.view.querySelectorAll("[data-regions]")].find((e) => e.dataset.regions.split("|").includes(region));
    if (!g) return;
    const r = g.querySelector("rect");
    this.fit({x: +r.getAttribute("x"), y: +r.getAttribute("y"), width: +r.getAttribute("width"),
      height: +r.getAttribute("height")});
  }

  panZoom() {
    this.svg.addEventListener("wheel", (ev) => {
      ev.preventDefault();
      const f = Math.exp(-ev.deltaY * 0.0015), r = this.svg.getBoundingClientRect();
      const px = ev.clientX - r.left, py = ev.clientY - r.top;
      this.tx = px - (px - this.tx) * f; this.ty = py - (py - this.ty) * f; this.scale *= f;
      this.apply();
    }, {passive: false});
    let drag = null;
    this.svg.addEventListener("mousedown", (ev) => { drag = [ev.clientX - this.tx, ev.clientY - this.ty]; });
    window.addEventListener("mouseup", () => { drag = null; });
    window.addEventListener("mousemove", (ev) => {
      if (drag) { this.tx = ev.clientX - drag[0]; this.ty = ev.clientY - drag[1]; this.apply(); }
    });
  }
}

// the kernel census as bars, one row per kernel class: measured alone (grey), its roofline (a thin blue bar over
// it), and the time of the alternative the plan runs instead (orange, beneath), on one linear scale of seconds
function seconds(s) {
  for (const [unit, scale] of [["s", 1], ["ms", 1e-3], ["µs", 1e-6]]) if (Math.abs(s) >= scale) return (s / scale).toPrecision(3) + " " + unit;
  return (s / 1e-9).toPrecision(3) + " ns";
}

function drawCensus(root, data) {
  const rowH = 3 * LINE_H / 2 + 6, labelChars = Math.min(70, Math.max(...data.rows.map((r) => r.label.length)));
  const labelW = labelChars * CHAR_W + 2 * PAD, width = Math.max(root.clientWidth || 1200, labelW + 300);
  const barW = width - labelW - 260, height = data.rows.length * rowH + 2 * PAD;
  const top = Math.max(...data.rows.flatMap((r) => [r.measured || 0, r.roofline || 0, r.chosen || 0]), 1e-12);
  const svg = el("svg", {width, height}, root);
  data.rows.forEach((r, i) => {
    const y = PAD + i * rowH, g = el("g", {class: "census-row"}, svg);
    const label = r.label.length > labelChars ? r.label.slice(0, labelChars - 3) + "..." : r.label;
    text(g, PAD, y + LINE_H, [label], {});
    const bar = (cls, value, dy, h) => el("rect", {class: cls, x: labelW, y: y + dy, height: h,
      width: Math.max(1, barW * value / top)}, g);
    if (r.measured != null) bar("measured", r.measured, 2, LINE_H - 2);
    bar("roofline", r.roofline, LINE_H / 2 - 1, 3);
    if (r.chosen != null) bar("chosen", r.chosen, LINE_H + 1, LINE_H / 2);
    const shown = r.measured == null ? "not measured" : seconds(r.measured);
    text(g, labelW + barW * Math.max(r.measured || 0, r.roofline) / top + 6, y + LINE_H,
      [shown + (r.chosen != null ? ` -> ${seconds(r.chosen)} (${r.chosenName})` : "")], {});
    el("title", {}, g).textContent = `${r.label}\nmeasured alone ${r.measured == null ? "-" : seconds(r.measured)}, ` +
      `roofline ${seconds(r.roofline)}` + (r.chosen != null ? `\nwith ${r.chosenName}: ${seconds(r.chosen)}` : "");
  });
  const b = svg.getBoundingClientRect();  // where the chart was drawn, in viewport pixels, for tests and tools
  root.dataset.box = [b.left, b.top, b.right, b.bottom].map(Math.round).join(",");
  root.dataset.rows = data.rows.length;
}

(async () => {
  const census = document.getElementById("census-data");
  if (census) drawCensus(document.getElementById("census"), JSON.parse(census.textContent));
  const panes = {};
  for (const [id, data] of Object.entries(JSON.parse(document.getElementById("graph-data").textContent))) {
    panes[id] = new Pane(document.getElementById(id), data);
    await panes[id].layout();
  }
  for (const row of document.querySelectorAll("tr[data-region]")) {
    row.addEventListener("click", () => Object.values(panes).forEach((p) => p.focus(row.dataset.region)));
  }
  for (const button of document.querySelectorAll("button[data-fit]")) {
    button.addEventListener("click", () => panes[button.dataset.fit].fit());
  }
  // where each region was drawn, for tests and tools: the page's own record, in viewport pixels
  for (const g of document.querySelectorAll("[data-regions]")) {
    const r = g.getBoundingClientRect();
    g.dataset.box = [r.left, r.top, r.right, r.bottom].map(Math.round).join(",");
  }
  document.body.dataset.viewport = `${window.innerWidth},${window.innerHeight}`;
  document.body.dataset.ready = "yes";
})();
