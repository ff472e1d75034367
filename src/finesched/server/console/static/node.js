// One node: a bar per device (what each workload holds of its core and memory, used outside
// finesched, free), the CPU topology (sockets > NUMA nodes > cores > threads, each logical CPU
// coloured by pool and labelled with the workload holding it), NUMA zones, and the agent's report.

import { api } from "./api.js";
import { amounts, colorFor, deviceAmount, h, keyValues, meter, resourceAmount, s, section, table, workloadLink } from "./dom.js";

export function mount(main, [name]) {
  const root = h("div", { id: "node-page" }, h("p", { class: "muted" }, "Loading…"));
  main.replaceChildren(root);
  return {
    periodic: true,
    minInterval: 1000,
    // Its own events, and any workload's (a workload bound or gone may have been on this node).
    wants: (event) => event.kind === "Workload" || (event.kind === "Node" && event.object === name),
    async refresh() {
      const data = await api(`/ui/api/nodes/${encodeURIComponent(name)}`);
      root.replaceChildren(...draw(data));
    },
  };
}

function draw(node) {
  const state = node.status.ready ? (node.status.cordoned ? "Ready, cordoned" : "Ready") : "NotReady";
  return [
    h("h1", {}, `Node ${node.name} `, h("span", { class: `badge ${node.status.ready ? "ok" : "bad"}`, id: "node-state" }, state)),
    keyValues([
      ["last heartbeat", node.status.heartbeat || "never (registered by hand)"],
      ["tenant isolation", isolation(node.status.isolation)],
      ["labels", amounts(node.labels)],
    ]),
    section("Resources", resourceTable(node.resources)),
    section("Devices", devices(node.devices)),
    section("CPUs", cpuLegend(), topology(node.cpus), pools(node.pools)),
    section("NUMA zones", zones(node.zones, node.unboundUse)),
    section("Workloads here", workloadTable(node.workloads)),
    section("Agent report (S0.2 encoding, as sent)", report(node.report)),
  ];
}

// Whether the node's agent keeps tenants apart (the TenantIsolation condition it reports).
function isolation(condition) {
  if (!condition) return h("span", { class: "muted", id: "node-isolation" }, "not reported (no agent yet)");
  const ok = condition.status === "True";
  return h("span", { id: "node-isolation" }, h("span", { class: `badge ${ok ? "ok" : "bad"}` }, ok ? "yes" : "no"), ` ${condition.message}`);
}

function resourceTable(resources) {
  return table(
    ["resource", "allocatable", "allocated", "free", ""],
    Object.entries(resources).map(([name, r]) => [
      name,
      resourceAmount(name, r.allocatable),
      resourceAmount(name, r.allocated),
      resourceAmount(name, r.free),
      meter(r.allocated / r.allocatable),
    ]),
  );
}

// Devices -----------------------------------------------------------------------------------------------
function devices(list) {
  if (!list.length) return h("p", { class: "muted" }, "no devices");
  return h("div", { class: "devices" }, list.map(deviceBars));
}

function deviceBars(device) {
  const dims =
    device.type === "gpu"
      ? ["gpu-core", device.total["gpu-memory"] ? "gpu-memory" : "gpu-memory-ratio"]
      : Object.keys(device.total);
  const where = [device.numa !== null ? `numa ${device.numa}` : "", device.pcie ? device.pcie : "", device.uuid || ""].filter(Boolean);
  return h(
    "div",
    { class: `device ${device.healthy ? "" : "unhealthy"}`, "data-device": `${device.type}-${device.minor}` },
    h(
      "div",
      { class: "device-head" },
      h("strong", {}, `${device.type} ${device.minor}`),
      " ",
      h("span", { class: `badge ${device.healthy ? "ok" : "bad"}` }, device.healthy ? "healthy" : "unhealthy"),
      " ",
      h("span", { class: "muted" }, where.join(" · ")),
    ),
    dims.map((dim) => bar(device, dim)),
  );
}

// One dimension of one device: a segment per holder, then what is used outside finesched, then free.
function bar(device, dim) {
  const total = device.total[dim] || 0;
  const width = 600;
  const height = 18;
  const segments = [];
  let x = 0;
  const add = (amount, fill, label, attrs) => {
    if (!amount || !total) return;
    const w = (amount / total) * width;
    segments.push(s("rect", { x: x.toFixed(2), y: 0, width: Math.max(w, 1).toFixed(2), height, fill, ...attrs }, s("title", {}, label)));
    x += w;
  };
  for (const holder of device.holders) {
    const amount = holder.resources[dim] || 0;
    const who = holder.workload || "another tenant's workload";
    add(amount, colorFor(holder.workload), `${who}: ${deviceAmount(dim, amount)} of ${deviceAmount(dim, total)} ${label(dim)}`, {
      class: "held",
      "data-workload": holder.workload || "",
      "data-dim": dim,
      "data-amount": amount,
    });
  }
  add(device.foreign[dim] || 0, "url(#foreign)", `used outside finesched: ${deviceAmount(dim, device.foreign[dim] || 0)}`, {
    class: "foreign",
    "data-dim": dim,
    "data-amount": device.foreign[dim] || 0,
  });
  const free = device.free[dim] || 0;
  add(free, "#eef1f4", `free: ${deviceAmount(dim, free)}`, { class: "free", "data-dim": dim, "data-amount": free });
  return h(
    "div",
    { class: "bar-row" },
    h("span", { class: "bar-label" }, label(dim)),
    s(
      "svg",
      { class: "bar", viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", "data-dim": dim, "data-total": total },
      s("defs", {}, s("pattern", { id: "foreign", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" },
        s("rect", { width: 6, height: 6, fill: "#c9ced4" }), s("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#8b949e", "stroke-width": 3 }))),
      segments,
    ),
    h("span", { class: "bar-free" }, `${deviceAmount(dim, free)} free`),
  );
}

function label(dim) {
  return { "gpu-core": "core", "gpu-memory": "memory", "gpu-memory-ratio": "memory %" }[dim] || dim;
}

// CPUs ---------------------------------------------------------------------------------------------------
const POOLS = {
  LSE: "held exclusively (LSE; BE may not run here)",
  LSR: "held exclusively (LSR; BE may share it)",
  LS: "shared pool (LS workloads; BE too)",
  reserved: "reserved by the kubelet",
};

function cpuLegend() {
  return h(
    "p",
    { class: "legend" },
    Object.entries(POOLS).map(([pool, text]) => h("span", { class: "swatch-item" }, h("span", { class: `swatch cpu pool-${pool}` }), `${pool}: ${text}`)),
    h("span", { class: "swatch-item" }, h("span", { class: "swatch cpu be-dot" }), "dot: in the BE pool"),
  );
}

function topology(cpus) {
  if (!cpus.length) return h("p", { class: "muted" }, "the node declares no CPU topology (no pinned CPUs)");
  const sockets = group(cpus, (c) => c.socket);
  return h(
    "div",
    { class: "topology" },
    [...sockets].map(([socket, inSocket]) =>
      h(
        "div",
        { class: "socket", "data-socket": socket },
        h("div", { class: "level" }, `socket ${socket}`),
        [...group(inSocket, (c) => c.numa)].map(([numa, inNuma]) =>
          h(
            "div",
            { class: "numa", "data-numa": numa },
            h("div", { class: "level" }, `NUMA node ${numa}`),
            h(
              "div",
              { class: "cores" },
              [...group(inNuma, (c) => c.core)].map(([core, threads]) => h("div", { class: "core", "data-core": core, title: `core ${core}` }, threads.map(cpuCell))),
            ),
          ),
        ),
      ),
    ),
  );
}

function cpuCell(cpu) {
  const holder = cpu.holder || (cpu.holderQos ? "another tenant's workload" : "");
  const text = `CPU ${cpu.id} · core ${cpu.core} · ${POOLS[cpu.pool]}${holder ? ` · held by ${holder}` : ""}${cpu.be ? " · in the BE pool" : ""}`;
  const short = cpu.holder ? cpu.holder.split("/").pop() : cpu.holderQos ? "…" : "";
  return h(
    "div",
    {
      class: `cpu pool-${cpu.pool}${cpu.be ? " be" : ""}`,
      "data-cpu": cpu.id,
      "data-pool": cpu.pool,
      "data-holder": cpu.holder || "",
      title: text,
      style: cpu.holder ? `border-color:${colorFor(cpu.holder)}` : undefined,
    },
    h("span", { class: "cpu-id" }, String(cpu.id)),
    h("span", { class: "cpu-holder" }, short),
  );
}

function group(items, key) {
  const out = new Map();
  for (const item of items) {
    const k = key(item);
    if (!out.has(k)) out.set(k, []);
    out.get(k).push(item);
  }
  return new Map([...out].sort((a, b) => a[0] - b[0]));
}

function pools(p) {
  if (!p || !Object.keys(p).length) return null;
  const names = (list) => (list.length ? list.map((k, i) => [i ? ", " : "", workloadLink(k)]) : "none");
  return keyValues([
    ["shared pool (LS)", p.shared || "-"],
    ["BE pool", p.be || "-"],
    ["held exclusively", p.exclusive || "-"],
    ["reserved", p.reserved || "-"],
    ["LS workloads sharing", names(p.ls)],
    ["BE workloads", names(p.beWorkloads)],
  ]);
}

// Zones, workloads, report ----------------------------------------------------------------------------------
// Each zone's cpu and memory left by the workloads bound to it, then what the others (the LS shared
// pool's, BE's) hold of the node without a zone: taken from any of them.
function zones(list, unbound) {
  const cell = (zone, name) => {
    const r = zone.resources.find((x) => x.name === name);
    const [free, allocatable, capacity] = r ? [r.available, r.allocatable, r.capacity].map((v) => resourceAmount(name, v)) : [];
    return r ? `${free} free of ${allocatable} (capacity ${capacity})` : "-";
  };
  const rows = list.map((z) => h("tr", { "data-zone": z.name }, [z.name, cell(z, "cpu"), cell(z, "memory")].map((c) => h("td", {}, c))));
  if (list.length && unbound) {
    const used = (name) => `${resourceAmount(name, unbound[name] || 0)} in use`;
    rows.push(h("tr", { "data-zone": "unbound" }, [h("td", {}, "no zone (LS shared pool, BE): taken from any zone"), h("td", {}, used("cpu")), h("td", {}, used("memory"))]));
  }
  return table(["zone", "cpu", "memory"], rows, { empty: "no NUMA zones" });
}

function workloadTable(list) {
  return table(
    ["workload", "QoS", "cpuset"],
    list.map((w) => [workloadLink(w.workload), w.qos, w.cpuset || "shared"]),
    { empty: "nothing runs here", cls: "node-workloads" },
  );
}

function report(r) {
  if (!r) return h("p", { class: "muted" }, "no report: no agent has reported for this node");
  const rows = [];
  for (const [kind, dims] of Object.entries(r.sent.devices || {})) {
    for (const [dim, enc] of Object.entries(dims)) {
      const decoded = (r.decoded[kind] || {})[dim];
      const shown = typeof decoded === "object" ? Object.entries(decoded).map(([m, v]) => `${kind} ${m}: ${deviceAmount(dim, v)}`).join(", ") : String(decoded);
      rows.push([kind, dim, String(enc.k), String(enc.count), String(enc.bits), shown]);
    }
  }
  return [
    table(["type", "dimension", "K (free, encoded)", "devices", "bits", "decoded free per device"], rows, { empty: "the report carries no device vectors" }),
    h("details", {}, h("summary", {}, "the report as JSON"), h("pre", { class: "json" }, JSON.stringify(r.sent, null, 2))),
  ];
}
