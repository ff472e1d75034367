// The overview: nodes by state, resources, GPU fragmentation, why work waits, tenants, and a map of
// every node (one cell each, coloured by use; click one to open it).

import { api } from "./api.js";
import { h, meter, nodeLink, number, pct, section, table, workloadLink } from "./dom.js";

export function mount(main) {
  const summary = h("div", { id: "overview" }, h("p", { class: "muted" }, "Loading…"));
  const map = h("div", { id: "node-map" });
  main.replaceChildren(h("h1", {}, "Cluster"), summary, section("Node map", map));
  return {
    periodic: true,
    minInterval: 2000,
    wants: () => true,
    async refresh() {
      const nodes = api("/ui/api/nodes");
      summary.replaceChildren(...draw(await api("/ui/api/overview")));
      map.replaceChildren(...drawMap(await nodes));
    },
  };
}

function draw(data) {
  const n = data.nodes;
  const cards = h("div", { class: "cards" }, [
    section(
      "Nodes",
      h(
        "div",
        { class: "figures" },
        figure("total", number(n.total), "nodes-total"),
        figure("Ready", number(n.ready), "nodes-ready"),
        figure("NotReady", number(n.notReady), "nodes-notready", n.notReady ? "bad" : ""),
        figure("cordoned", number(n.cordoned), "nodes-cordoned", n.cordoned ? "warn" : ""),
      ),
      n.attention.length
        ? h(
            "p",
            { class: "attention" },
            "Needs attention: ",
            n.attention.map((a, i) => [i ? ", " : "", nodeLink(a.name), a.ready ? "" : " (NotReady)", a.cordoned ? " (cordoned)" : ""]),
          )
        : null,
    ),
    section("Pending", h("div", { class: "figures" }, figure("waiting", number(data.pending.total), "pending-total")), pendingTable(data.pending.byReason)),
    section("GPU fragmentation", fragmentation(data.fragmentation)),
  ]);
  return [cards, section("Resources", resourceTable(data.resources)), section("Tenants", tenantTable(data.tenants))];
}

function figure(label, value, id, tone = "") {
  return h("div", { class: `figure ${tone}` }, h("span", { class: "value", id }, String(value)), h("span", { class: "label" }, label));
}

function pendingTable(groups) {
  return table(
    ["reason (the scheduler's)", "workloads", "nodes", "for example"],
    groups.map((g) => [g.reason, number(g.workloads), g.nodes ? number(g.nodes) : "-", g.examples.map((k, i) => [i ? ", " : "", workloadLink(k)])]),
    { empty: "nothing waits", cls: "pending" },
  );
}

function fragmentation(frag) {
  if (!frag) return h("p", { class: "muted" }, "no GPUs in the cluster");
  const typical = frag.typical.map((t) => {
    const gpu = t.gpuCount > 1 || t.gpuMilli >= 1000 ? `${t.gpuCount} × whole GPU` : `${t.gpuMilli / 10} % of one GPU`;
    return `${gpu}${t.cpu ? ` + ${t.cpu / 1000} cpu` : ""} (${t.count})`;
  });
  return [
    h(
      "div",
      { class: "figures" },
      figure("idle GPUs", number(frag.idleGPUs), "gpu-idle"),
      figure("usable by the typical request", number(frag.usableGPUs), "gpu-usable"),
      figure("fragmented", pct(frag.fragmentedShare), "gpu-fragmented", frag.fragmentedShare > 0.2 ? "warn" : ""),
    ),
    h(
      "p",
      { class: "muted" },
      "Fragmented: idle GPU capacity the typical request cannot use (FGD, as the simulator measures it). Typical request ",
      typicalSource(frag),
      typical.join("; "),
    ),
  ];
}

// A tenant's typical request is learned from its own workloads only: it sees nothing of the others' work.
function typicalSource(frag) {
  const whose = frag.typicalFrom === "tenant" ? "your tenant's " : "the ";
  if (frag.typicalLearned) return `learned from ${whose}GPU workloads running and waiting: `;
  return frag.typicalFrom === "tenant" ? "(no GPU workload of your tenant yet): " : "(no GPU workload yet): ";
}

function resourceTable(resources) {
  return table(
    ["resource", "allocatable", "allocated", "free", ""],
    resources.map((r) => [
      r.device ? `${r.name} (devices)` : r.name,
      r.shown.allocatable,
      r.shown.allocated,
      r.shown.free,
      meter(r.allocated / r.allocatable, `${pct(r.allocated / r.allocatable)} allocated`),
    ]),
    { cls: "resources" },
  );
}

function tenantTable(tenants) {
  const fmt = (m) => Object.entries(m || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "-";
  return table(
    ["tenant", "weight", "dominant share", "weighted", "holds", "min", "max / quota", "borrowed"],
    tenants.map((t) => [
      t.name + (t.parent ? ` (in ${t.parent})` : ""),
      String(t.weight),
      h("span", { class: "nowrap" }, meter(t.dominantShare), " ", pct(t.dominantShare)),
      pct(t.weightedShare),
      fmt(t.usage),
      fmt(t.min),
      [fmt(t.max), Object.keys(t.quota || {}).length ? ` / quota ${fmt(t.quota)}` : ""],
      fmt(t.borrowed),
    ]),
    { empty: "no tenant holds anything yet", cls: "tenants" },
  );
}

// The map: a canvas with one cell per node (GPU use where the node has GPUs, else CPU), NotReady
// nodes red, cordoned ones grey; hover names a node, click opens it.
function drawMap(nodes) {
  const count = nodes.names.length;
  const CELL = count <= 100 ? 28 : count <= 2000 ? 14 : 9;
  const perRow = Math.max(1, Math.min(Math.floor(1300 / CELL), Math.ceil(Math.sqrt(count * 4))));
  const canvas = h("canvas", {
    id: "node-canvas",
    width: perRow * CELL,
    height: Math.max(1, Math.ceil(count / perRow)) * CELL,
    "data-nodes": count,
    role: "img",
    "aria-label": `${count} nodes coloured by use`,
  });
  const ctx = canvas.getContext("2d");
  const use = (i) => (nodes.gpu && nodes.gpu[i] >= 0 ? nodes.gpu[i] : nodes.cpu ? nodes.cpu[i] : 0);
  for (let i = 0; i < count; i += 1) {
    const x = (i % perRow) * CELL;
    const y = Math.floor(i / perRow) * CELL;
    ctx.fillStyle = !nodes.ready[i] ? "#263238" : nodes.cordoned[i] ? "#9e9e9e" : heat(use(i));
    ctx.fillRect(x, y, CELL - 1, CELL - 1);
  }
  const tip = h("div", { class: "map-tip", id: "map-tip" }, "Hover a node; click to open it.");
  const index = (event) => {
    const rect = canvas.getBoundingClientRect();
    const col = Math.floor(((event.clientX - rect.left) * canvas.width) / rect.width / CELL);
    const row = Math.floor(((event.clientY - rect.top) * canvas.height) / rect.height / CELL);
    const i = row * perRow + col;
    return col < perRow && i < count ? i : -1;
  };
  canvas.addEventListener("mousemove", (event) => {
    const i = index(event);
    if (i < 0) return;
    const parts = [nodes.names[i], nodes.ready[i] ? "Ready" : "NotReady"];
    if (nodes.cordoned[i]) parts.push("cordoned");
    for (const key of ["cpu", "memory", "gpu"]) if (nodes[key] && nodes[key][i] >= 0) parts.push(`${key} ${nodes[key][i]} %`);
    tip.textContent = parts.join(" · ");
  });
  canvas.addEventListener("click", (event) => {
    const i = index(event);
    if (i >= 0) location.assign(`/ui/nodes/${encodeURIComponent(nodes.names[i])}`);
  });
  return [finder(nodes.names), canvas, tip, legend()];
}

function heat(percent) {
  const p = Math.max(0, Math.min(100, percent)) / 100;
  const hue = 140 - 140 * p; // green (idle) to red (full)
  return `hsl(${hue}, 60%, ${88 - 40 * p}%)`;
}

function legend() {
  const swatch = (color, label) => h("span", { class: "swatch-item" }, h("span", { class: "swatch", style: `background:${color}` }), label);
  return h(
    "p",
    { class: "legend" },
    swatch(heat(0), "idle"),
    swatch(heat(50), "half used"),
    swatch(heat(100), "full"),
    swatch("#9e9e9e", "cordoned"),
    swatch("#263238", "NotReady"),
    " (GPU core use on GPU nodes, CPU elsewhere)",
  );
}

function finder(names) {
  const input = h("input", { type: "search", id: "find-node", placeholder: `find one of ${names.length} nodes`, "aria-label": "find node" });
  const hits = h("span", { class: "hits" });
  input.addEventListener("input", () => {
    const q = input.value.trim();
    const found = q ? names.filter((n) => n.includes(q)).slice(0, 12) : [];
    hits.replaceChildren(...found.map((n, i) => [i ? " " : "", nodeLink(n)]).flat());
  });
  return h("div", { class: "finder" }, input, hits);
}
