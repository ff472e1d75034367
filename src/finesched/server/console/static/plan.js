// What if? Paste Workload manifests (YAML, several documents) and see where each would go now:
// POST /v1/plan plans them on a copy of the live state (nothing is stored). Invalid manifests come
// back with every problem's field path, shown per document with the line of the field itself.
// "Defragment" (POST /v1/plan?defragment=true) also plans moves of running workloads that allow
// them (spec.migration) for a workload that fits nowhere: listed under that workload, none made.

import { api } from "./api.js";
import { colorFor, errorLines, grantText, h, nodeLink, resourceAmounts, section, table } from "./dom.js";

const EXAMPLE = `apiVersion: finesched.io/v1alpha1
kind: Workload
metadata: {name: what-if-1, namespace: default}
spec:
  requests: {cpu: "2", memory: 4Gi, koordinator.sh/gpu-core: 50, koordinator.sh/gpu-memory-ratio: 50}
`;

export function mount(main, _params, who) {
  const text = h("textarea", { id: "plan-yaml", rows: 16, spellcheck: "false", "aria-label": "workload manifests (YAML)" });
  text.value = sessionStorage.getItem("finesched.plan") || EXAMPLE.replace("default", who.role === "tenant" ? who.tenant : "default");
  const answer = h("div", { id: "plan-answer" });
  const button = h("button", { type: "submit", id: "plan-run" }, "Where would they go?");
  const defragment = h("input", { type: "checkbox", id: "plan-defragment" });
  defragment.checked = sessionStorage.getItem("finesched.plan.defragment") === "true";
  const option = h("label", { for: "plan-defragment", title: "Also move running workloads that allow it (spec.migration) so that a workload that fits nowhere fits" }, defragment, " Defragment");
  const form = h("form", { id: "plan-form", class: "card" }, h("h2", {}, "Workload manifests"), text, h("div", {}, button, " ", option));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    sessionStorage.setItem("finesched.plan", text.value);
    sessionStorage.setItem("finesched.plan.defragment", String(defragment.checked));
    button.disabled = true;
    answer.replaceChildren(h("p", { class: "muted" }, "Planning on a copy of the live state…"));
    try {
      const path = defragment.checked ? "/v1/plan?defragment=true" : "/v1/plan";
      const result = await api(path, { method: "POST", body: text.value, contentType: "application/yaml" });
      answer.replaceChildren(...drawAnswer(result));
    } catch (error) {
      answer.replaceChildren(drawErrors(error, text.value));
    } finally {
      button.disabled = false;
      document.body.dataset.planned = String(Number(document.body.dataset.planned || 0) + 1);
    }
  });
  main.replaceChildren(
    h("h1", {}, "What if?"),
    h("p", { class: "muted" }, "Where would these workloads go now? Planned on a copy of the live state by the scheduler itself; nothing is submitted."),
    form,
    answer,
  );
  return { wants: () => false, async refresh() {} };
}

function drawAnswer(result) {
  const rows = result.results.map((r) => {
    const cells = [r.workload, nodeLink(r.node), r.score === null || r.score === undefined ? "-" : String(r.score), placement(r)];
    return h("tr", { "data-workload": r.workload, "data-node": r.node || "" }, cells.map((c) => h("td", {}, c)));
  });
  const s = result.summary;
  return [
    section(
      `Answer: ${s.placed} placed, ${s.unschedulable} not placed${s.evicted ? `, ${s.evicted} evicted` : ""}${s.moves ? `, ${s.moves} move(s)` : ""}`,
      h("p", { class: "muted" }, `On ${result.cluster.nodes} nodes as they are now${result.cluster.pending ? `; ${result.cluster.pending} workload(s) already waiting there are not part of this plan` : ""}.`),
      result.defragmentation ? h("p", { class: "muted", id: "plan-defrag-settings" }, settingsText(result.defragmentation)) : null,
      table(["workload", "node", "score", "placement, or why it fits nowhere"], rows, { cls: "plan-results" }),
    ),
  ];
}

// Which defragmentation settings the moves were planned with (the profile's, or the defaults).
function settingsText(defrag) {
  const where = defrag.source === "profile" ? "the profile's" : "the default (the profile does not defragment)";
  const settings = Object.entries(defrag.settings).map(([k, v]) => `${k} ${v}`).join(", ");
  return `Moves planned with ${where} defragmentation settings: ${settings}. None is made.`;
}

// One planned move: who (another tenant's workload unnamed), from where to where, why.
function moveItem(m) {
  const who = m.workload || "a workload of another tenant";
  return h("li", { class: "move", "data-mover": m.workload || "" }, `${who}: ${placeText(m.from)} → ${placeText(m.to)}`, h("div", { class: "muted" }, m.reason));
}

function placeText(place) {
  const grants = Object.entries(place.devices || {}).flatMap(([kind, gs]) => gs.map((g) => grantText(kind, g.minor, g.resources, g.mig)));
  return grants.length ? `${place.node} (${grants.join("; ")})` : place.node;
}

function placement(r) {
  if (!r.node) {
    return h(
      "div",
      { class: "why" },
      h("div", { class: r.waiting ? "warn" : "bad" }, r.waiting || r.error),
      Object.keys(r.reasons || {}).length ? h("ul", {}, Object.entries(r.reasons).map(([why, n]) => h("li", {}, `${n} node(s): ${why}`))) : null,
      r.preemption ? h("div", { class: "muted" }, `preemption: ${r.preemption}`) : null,
    );
  }
  const parts = [];
  if (r.evictedBy) parts.push(h("div", { class: "bad" }, `then evicted by ${r.evictedBy} (${r.evictionReason || ""})`));
  if (r.cpuset) parts.push(h("div", {}, "cpuset ", h("code", { class: "cpuset" }, r.cpuset)));
  if (r.numaResources) parts.push(h("div", {}, Object.entries(r.numaResources).map(([n, a]) => `numa ${n}: ${resourceAmounts(a)}`).join("; ")));
  for (const [kind, grants] of Object.entries(r.devices || {})) {
    for (const g of grants) {
      const swatch = h("span", { class: "swatch", style: `background:${colorFor(r.workload)}` });
      parts.push(h("div", { class: "grant", "data-device": `${kind}-${g.minor}` }, swatch, " ", grantText(kind, g.minor, g.resources, g.mig)));
    }
  }
  if (r.movedBy) parts.push(h("div", { class: "warn moved-by" }, `then moved by ${r.movedBy} to ${placeText(r.movedTo)}`));
  if (r.moves) {
    parts.push(h("div", { class: "moves" }, h("div", { class: "warn" }, `after ${r.moves.length} move(s): ${r.movesReason || ""}`), h("ol", {}, r.moves.map(moveItem))));
  }
  if (r.preempts) {
    const victims = r.preempts.map((v) => (v.workload ? `${v.workload} (${v.reason})` : `a workload of another tenant (priority ${v.priority})`));
    parts.push(h("div", { class: "warn preempts" }, `preempts ${victims.join(", ")}`));
  }
  return parts.length ? parts : "no cpuset or devices (shared pool)";
}

// Errors with their field paths, grouped by document ("document 2, line 14: spec.requests.cpu: ...").
function drawErrors(error, text) {
  const detail = error.detail;
  if (!Array.isArray(detail)) return h("div", { class: "error", role: "alert", id: "plan-errors" }, errorLines(error).map((l) => h("div", {}, l)));
  const starts = documentLines(text);
  const lines = detail.map((d) => {
    const loc = (d.loc || []).slice(d.loc && d.loc[0] === "body" ? 1 : 0);
    const doc = typeof loc[0] === "number" ? loc.shift() : null;
    // the field's own line when the server found it (YAML), else the line its document starts on
    const line = d.line ? `, line ${d.line}` : starts[doc] ? ` (from line ${starts[doc]})` : "";
    const where = doc === null ? "" : `document ${doc + 1}${line}: `;
    const value = d.input !== undefined ? ` ${JSON.stringify(d.input)}` : "";
    return h("div", { class: "field-error", "data-path": loc.join(".") }, where, h("code", {}, loc.join(".") || "(document)"), `:${value} ${d.msg}`);
  });
  return h("div", { class: "error", role: "alert", id: "plan-errors" }, h("strong", {}, `The server refused the manifests (${error.status}):`), lines);
}

// The line each non-empty YAML document starts on (documents split by "---" lines).
function documentLines(text) {
  const starts = [];
  let start = 1;
  let content = false;
  text.split("\n").forEach((line, i) => {
    if (/^---/.test(line)) {
      if (content) starts.push(start);
      start = i + 2;
      content = false;
    } else if (line.trim() && !line.trim().startsWith("#")) {
      if (!content) start = i + 1;
      content = true;
    }
  });
  if (content) starts.push(start);
  return starts;
}
