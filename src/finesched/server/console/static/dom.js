// Building the page: elements from data (text only: nothing the server sends is parsed as HTML),
// tables, amounts for people, and one stable colour per workload.

const SVG_NS = "http://www.w3.org/2000/svg";

// h("a", {href: "/ui", class: "x"}, "text", child, ...): an element with attributes and children.
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

// An SVG element (same call shape as h).
export function s(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

function setAttrs(node, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else if (key === "style") node.style.cssText = String(value); // CSSOM: allowed where inline styles are not
    else node.setAttribute(key, value === true ? "" : String(value));
  }
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

// A table: headers, then rows of cells (strings or elements); `empty` when there are no rows.
export function table(headers, rows, { empty = "none", cls = "" } = {}) {
  if (!rows.length) return h("p", { class: "muted" }, empty);
  return h(
    "table",
    { class: `grid ${cls}` },
    h("thead", {}, h("tr", {}, headers.map((title) => h("th", {}, title)))),
    h("tbody", {}, rows.map((cells) => (cells instanceof Node ? cells : h("tr", {}, cells.map((c) => h("td", {}, c)))))),
  );
}

export function section(title, ...children) {
  return h("section", { class: "card" }, h("h2", {}, title), ...children);
}

// A horizontal usage bar: `fraction` in [0, 1].
export function meter(fraction, label = "") {
  const pct = Math.max(0, Math.min(1, fraction || 0)) * 100;
  const tone = pct >= 90 ? "hot" : pct >= 70 ? "warm" : "ok";
  return h(
    "span",
    { class: "meter", title: label || `${pct.toFixed(1)} %` },
    h("span", { class: `fill ${tone}`, style: `width:${pct.toFixed(1)}%` }),
  );
}

// A count or amount with thousands separators and at most one decimal: 21126.05 -> "21,126.1".
export function number(value) {
  return Number(value || 0).toLocaleString("en", { maximumFractionDigits: 1 });
}

export function pct(fraction, digits = 1) {
  return `${(100 * (fraction || 0)).toFixed(digits)} %`;
}

// Amounts: the same rules as finesched.quantity.human_quantity (Python), checked against the same
// table (tests/quantity_table.py). cpu: whole cores "4", else millicores "500m". bytes: below 1Ki the
// number; else the largest binary suffix under which it is at least 1, a whole number when exact
// ("16Gi"), else rounded half up to one decimal that is always shown ("9.6Gi", "10.0Gi"). counts: the
// number. BigInt throughout: no float rounding, and the API's decimal text beyond 2^53 stays exact.
const BINARY = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
const DECIMAL = { n: -9, u: -6, m: -3, "": 0, k: 3, M: 6, G: 9, T: 12, P: 15, E: 18 };
const ALIASED = new Set(["gpu-core", "gpu-memory", "gpu-memory-ratio", "gpu", "gpu.shared", "rdma", "fpga"]);
const BYTE_NAMES = new Set(["memory", "ephemeral-storage", "storage", "gpu-memory"]);

// How amounts of resource `name` are counted (finesched.model.resources.resource_kind).
export function kindOf(name) {
  let short = String(name);
  for (const prefix of ["koordinator.sh/", "kubernetes.io/"]) {
    if (short.startsWith(prefix) && ALIASED.has(short.slice(prefix.length))) short = short.slice(prefix.length);
  }
  if (short === "cpu") return "cpu";
  return BYTE_NAMES.has(short) || short.startsWith("hugepages-") ? "bytes" : "count";
}

// An exact amount in the kind's unit (millicores, bytes, things) as a BigInt, from an integer or the
// API's quantity text ("4Gi", "500m", "10307921510"); null for anything else.
function exact(value, kind) {
  if (typeof value === "bigint") return value;
  if (typeof value === "number") return Number.isSafeInteger(value) ? BigInt(value) : null;
  const match = /^(-?)([0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$/.exec(String(value));
  if (!match) return null;
  let v = BigInt(match[2]);
  const suffix = match[3];
  if (BINARY.includes(suffix)) v <<= BigInt(10 * (BINARY.indexOf(suffix) + 1));
  let exp = (DECIMAL[suffix] || 0) + (kind === "cpu" ? 3 : 0);
  for (; exp > 0; exp -= 1) v *= 10n;
  for (; exp < 0; exp += 1) {
    if (v % 10n) return null; // below the unit: not an amount the API writes
    v /= 10n;
  }
  return match[1] ? -v : v;
}

export function quantity(value, kind) {
  const v = exact(value, kind);
  if (v === null) return String(value);
  if (v < 0n) return `-${quantity(-v, kind)}`;
  if (kind === "cpu") return v % 1000n === 0n ? String(v / 1000n) : `${v}m`;
  if (kind !== "bytes" || v < 1024n) return String(v);
  let unit = Math.min(Math.floor((v.toString(2).length - 1) / 10), BINARY.length) - 1;
  for (;;) {
    const scale = 1n << BigInt(10 * (unit + 1));
    if (v % scale === 0n) return `${v / scale}${BINARY[unit]}`;
    const tenths = (v * 20n + scale) / (2n * scale); // round(v * 10 / scale), halves up
    if (tenths < 10240n || unit === BINARY.length - 1) return `${tenths / 10n}.${tenths % 10n}${BINARY[unit]}`;
    unit += 1;
  }
}

// An amount of resource `name` as every view shows it ("500m", "9.6Gi", "8").
export function resourceAmount(name, value) {
  return quantity(value, kindOf(name));
}

// "cpu=500m, memory=9.6Gi" ("-" when there are none).
export function resourceAmounts(map) {
  const entries = Object.entries(map || {});
  return entries.length ? entries.map(([k, v]) => `${k}=${resourceAmount(k, v)}`).join(", ") : "-";
}

// A device dimension's amount for people: bytes for gpu-memory, percent of one device otherwise.
// (The /v1 binding views write quantities as text, "4Gi": read, then shown the same way.)
export function deviceAmount(dim, value) {
  if (dim === "gpu-memory") return quantity(value, "bytes");
  return typeof value === "string" && /[a-zA-Z]/.test(value) ? value : `${value}%`;
}

// One device grant as the CLI writes it: "gpu 0: 50% core, 20Gi", "rdma 1: 100%".
// A MIG grant names its instance (profile, first slice) as the CLI's plan table does.
export function grantText(kind, minor, resources, mig) {
  const r = resources || {};
  let shown;
  if (mig) {
    shown = [`MIG ${mig.profile} at start ${mig.start}`];
  } else if (kind === "gpu") {
    shown = [];
    if (r["gpu-core"] !== undefined) shown.push(`${deviceAmount("gpu-core", r["gpu-core"])} core`);
    if (r["gpu-memory"] !== undefined) shown.push(deviceAmount("gpu-memory", r["gpu-memory"]));
    else if (r["gpu-memory-ratio"] !== undefined) shown.push(`${deviceAmount("gpu-memory-ratio", r["gpu-memory-ratio"])} memory`);
  } else {
    shown = Object.entries(r).map(([dim, v]) => (dim === kind ? deviceAmount(dim, v) : `${dim} ${v}`));
  }
  return `${kind} ${minor}: ${shown.join(", ")}`;
}

// One colour per workload, the same on every page and every refresh (hashed into the hue circle).
export function colorFor(key) {
  if (!key) return "#9aa3ad";
  let hash = 2166136261;
  for (let i = 0; i < key.length; i += 1) hash = Math.imul(hash ^ key.charCodeAt(i), 16777619);
  const hue = (hash >>> 0) % 360;
  return `hsl(${hue}, 62%, 52%)`;
}

export function link(href, text) {
  return h("a", { href }, text);
}

export function workloadLink(key) {
  return key ? link(`/ui/workloads/${key}`, key) : h("span", { class: "muted" }, "another tenant's workload");
}

export function nodeLink(name) {
  return name ? link(`/ui/nodes/${encodeURIComponent(name)}`, name) : "-";
}

export function phaseBadge(phase) {
  return h("span", { class: `badge phase-${String(phase || "").toLowerCase()}` }, phase || "-");
}

// The server's error detail as lines: "body.0.spec.requests.cpu: "abc" is not a quantity".
export function errorLines(error) {
  const detail = error && error.detail !== undefined ? error.detail : String(error);
  if (!Array.isArray(detail)) return [String(detail)];
  return detail.map((d) => {
    const where = (d.loc || []).join(".");
    const value = d.input !== undefined ? ` ${JSON.stringify(d.input)}` : "";
    return `${where}:${value} ${d.msg}`;
  });
}

export function errorBox(error) {
  return h("div", { class: "error", role: "alert" }, errorLines(error).map((line) => h("div", {}, line)));
}

export function keyValues(entries) {
  return h(
    "dl",
    { class: "kv" },
    entries.filter(Boolean).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v === undefined || v === null ? "-" : v)]),
  );
}

export function amounts(map) {
  const entries = Object.entries(map || {});
  return entries.length ? entries.map(([k, v]) => `${k}=${v}`).join(", ") : "-";
}
