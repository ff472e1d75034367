// The overview: nodes by state, resources, GPU fragmentation, why work waits, tenants, and a map of
// every node (one cell each, coloured by use; click one to open it).

import { api } from "./api.js";
import { errorBox, h, meter, nodeLink, number, pct, resourceAmount, section, table, workloadLink } from "./dom.js";

export function mount(main) {
  const summary = h("div", { id: "overview" }, h("p", { class: "muted" }, "Loading…"));
  const map = h("div", { id: "node-map" });
  const grouping = groupChoice();
  main.replaceChildren(h("h1", {}, "Cluster"), summary, section("Node map", grouping.control, map));
  let drawn = 0; // the newest map request drawn: a change of grouping may overtake a periodic refresh
  async function drawNodes() {
    const asked = (drawn += 1);
    const nodes = await nodesGrouped(grouping);
    if (asked === drawn) map.replaceChildren(...drawMap(nodes));
  }
  grouping.onChange(() => drawNodes().catch((error) => map.replaceChildren(errorBox(error))));
  return {
    periodic: true,
    minInterval: 2000,
    wants: () => true,
    async refresh() {
      const nodes = drawNodes();
      summary.replaceChildren(...draw(await api("/ui/api/overview")));
      await nodes;
    },
  };
}

// The map's "group by" choice: none, or one level of one of the scheduler's topologies. Kept in the
// address (?topology=dc&level=...), so a reload or a shared link shows the same grouping.
function groupChoice() {
  const select = h("select", { id: "map-group", "aria-label": "group the node map by" });
  const params = new URLSearchParams(location.search);
  let chosen = params.get("topology") && params.get("level") ? [params.get("topology"), params.get("level")] : null;
  let listed = null;
  const note = h("span", { class: "muted", id: "map-group-note" });
  const value = (choice) => (choice ? JSON.stringify(choice) : "");
  const keep = () => {
    const url = new URL(location.href);
    url.searchParams.delete("topology");
    url.searchParams.delete("level");
    if (chosen) {
      url.searchParams.set("topology", chosen[0]);
      url.searchParams.set("level", chosen[1]);
    }
    history.replaceState(null, "", url);
  };
  return {
    control: h("div", { class: "finder" }, h("label", {}, "Group by ", select), note),
    get chosen() {
      return chosen;
    },
    // The topologies the server knows now: the options follow them; a grouping whose topology or
    // level is gone falls back to none, saying so.
    offer(topologies) {
      const text = JSON.stringify(topologies);
      if (text === listed) return;
      listed = text;
      const options = [h("option", { value: "" }, "none (every node)")];
      for (const t of topologies) {
        for (const level of t.levels) options.push(h("option", { value: value([t.name, level]) }, `${t.name}: ${level}`));
      }
      select.replaceChildren(...options);
      this.select(chosen && options.some((o) => o.value === value(chosen)) ? chosen : null, chosen);
    },
    select(choice, gone = null) {
      chosen = choice;
      select.value = value(choice);
      note.textContent = gone && !choice ? `topology ${gone[0]} has no level ${gone[1]} now` : "";
      keep();
    },
    onChange(handler) {
      select.addEventListener("change", () => {
        this.select(select.value ? JSON.parse(select.value) : null);
        handler();
      });
    },
  };
}

// The nodes for the map, grouped as chosen; a topology deleted (or changed) since it was chosen is
// answered 422: the map then shows every node, and the choice says why.
async function nodesGrouped(grouping) {
  const chosen = grouping.chosen;
  let nodes;
  if (chosen) {
    const query = new URLSearchParams({ topology: chosen[0], level: chosen[1] });
    try {
      nodes = await api(`/ui/api/nodes?${query}`);
    } catch (error) {
      if (error.status !== 422) throw error;
      nodes = await api("/ui/api/nodes");
    }
  } else {
    nodes = await api("/ui/api/nodes");
  }
  grouping.offer(nodes.topologies || []);
  if (!grouping.chosen) delete nodes.groups;
  return nodes;
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
// nodes red, cordoned ones grey; hover names a node, click opens it. Grouped by a topology's level:
// one box per domain (its name, node count, free of allocatable cpu, memory and GPUs) holding its
// nodes' cells, and the nodes in no domain of the level in a box of their own.
function drawMap(nodes) {
  const count = nodes.names.length;
  const CELL = count <= 100 ? 28 : count <= 2000 ? 14 : 9;
  const tip = h("div", { class: "map-tip", id: "map-tip" }, "Hover a node; click to open it.");
  const all = Array.from({ length: count }, (_, i) => i);
  const body = nodes.groups ? domainBoxes(nodes, CELL, tip) : [cells(nodes, all, CELL, 1300, tip, "node-canvas")];
  return [finder(nodes.names), ...body, tip, legend()];
}

// At most this many domain boxes are drawn (the first by name); a finer level than that is a list,
// not a map: the note says how many are left out, and the finder still reaches every node.
const MAX_BOXES = 300;

function domainBoxes(nodes, CELL, tip) {
  const groups = nodes.groups;
  const shown = groups.domains.slice(0, MAX_BOXES);
  const boxes = shown.map((d) =>
    h(
      "div",
      { class: "domain", "data-domain": d.name, "data-nodes": d.nodes },
      h("div", { class: "domain-head" }, h("strong", {}, d.name), h("span", { class: "muted" }, ` ${number(d.nodes)} nodes`)),
      capacity(d),
      cells(nodes, d.members, CELL, 420, tip),
    ),
  );
  if (groups.outside.length) {
    boxes.push(
      h(
        "div",
        { class: "domain outside", "data-domain": "", "data-nodes": groups.outside.length },
        h("div", { class: "domain-head" }, h("strong", {}, "outside"), h("span", { class: "muted" }, ` ${number(groups.outside.length)} nodes without ${groups.level}`)),
        cells(nodes, groups.outside, CELL, 420, tip),
      ),
    );
  }
  const more = groups.domains.length - shown.length;
  const note = more > 0 ? h("p", { class: "muted" }, `${number(more)} more domains of ${groups.level} not drawn; group by a coarser level.`) : null;
  return [h("div", { class: "domains", id: "node-domains", "data-level": groups.level }, boxes), note];
}

// A domain's free and allocatable amounts: cpu and memory as every view writes them, GPUs whole.
function capacity(domain) {
  const rows = Object.keys(domain.allocatable).map((name) => {
    const alloc = domain.allocatable[name];
    const free = domain.free[name] || 0;
    const gpus = name === "gpu-core";
    const shown = (v) => (gpus ? number(v / 100) : resourceAmount(name, v));
    return h(
      "div",
      { class: "domain-amount", "data-resource": name, "data-free": free, "data-allocatable": alloc },
      h("span", { class: "name" }, gpus ? "GPUs" : name),
      " ",
      meter(1 - free / alloc, `${pct(1 - free / alloc)} allocated`),
      " ",
      h("span", { class: "free" }, `${shown(free)} free of ${shown(alloc)}`),
    );
  });
  return h("div", { class: "domain-capacity" }, rows);
}

// One canvas with a cell for each node of `members` (positions in the map's arrays).
function cells(nodes, members, CELL, width, tip, id) {
  const count = members.length;
  const perRow = Math.max(1, Math.min(Math.floor(width / CELL), Math.ceil(Math.sqrt(count * 4))));
  const canvas = h("canvas", {
    id,
    class: "node-cells",
    width: perRow * CELL,
    height: Math.max(1, Math.ceil(count / perRow)) * CELL,
    "data-nodes": count,
    role: "img",
    "aria-label": `${count} nodes coloured by use`,
  });
  const ctx = canvas.getContext("2d");
  const use = (i) => (nodes.gpu && nodes.gpu[i] >= 0 ? nodes.gpu[i] : nodes.cpu ? nodes.cpu[i] : 0);
  for (let k = 0; k < count; k += 1) {
    const i = members[k];
    const x = (k % perRow) * CELL;
    const y = Math.floor(k / perRow) * CELL;
    ctx.fillStyle = !nodes.ready[i] ? "#263238" : nodes.cordoned[i] ? "#9e9e9e" : heat(use(i));
    ctx.fillRect(x, y, CELL - 1, CELL - 1);
  }
  const index = (event) => {
    const rect = canvas.getBoundingClientRect();
    const col = Math.floor(((event.clientX - rect.left) * canvas.width) / rect.width / CELL);
    const row = Math.floor(((event.clientY - rect.top) * canvas.height) / rect.height / CELL);
    const k = row * perRow + col;
    return col < perRow && k < count ? members[k] : -1;
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
  return canvas;
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
