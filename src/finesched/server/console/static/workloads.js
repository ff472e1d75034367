// Workloads: the list (filters: tenant, phase, node; GET /v1/workloads answers only what the token
// may see) and one workload with its binding, events, what its agent applied and the tail of its
// output (GET /v1/workloads/{ns}/{name}/logs: the server relays it from the node's agent).

import { api, apiAll, apiText } from "./api.js";
import { deviceAmount, grantText, h, keyValues, nodeLink, phaseBadge, resourceAmounts, section, table, workloadLink } from "./dom.js";

const PHASES = ["", "Pending", "Bound", "Running", "Succeeded", "Failed", "Rejected"];
const SHOWN = 1000;

export const list = {
  mount(main, _params, who) {
    const query = new URLSearchParams(location.search);
    const field = (name, attrs) => h("input", { name, id: `filter-${name}`, value: query.get(name) || "", ...attrs });
    const tenant = who.role === "tenant" ? h("input", { name: "tenant", id: "filter-tenant", value: who.tenant, disabled: true }) : field("tenant", { placeholder: "any tenant" });
    const phase = h("select", { name: "phase", id: "filter-phase" }, PHASES.map((p) => h("option", { value: p, selected: p === (query.get("phase") || "") }, p || "any phase")));
    const node = field("node", { placeholder: "any node" });
    const form = h("form", { class: "filters", id: "workload-filters" }, tenant, phase, node, h("button", { type: "submit" }, "Filter"));
    const body = h("div", { id: "workload-list" }, h("p", { class: "muted" }, "Loading…"));
    let params = filters();
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      params = filters();
      history.replaceState(null, "", `/ui/workloads${params.toString() ? `?${params}` : ""}`);
      page.refresh();
    });
    function filters() {
      const out = new URLSearchParams();
      for (const input of [tenant, phase, node]) if (input.value && !input.disabled) out.set(input.name, input.value);
      return out;
    }
    main.replaceChildren(h("h1", {}, "Workloads"), form, body);
    const page = {
      minInterval: 1000,
      wants: (event) => event.kind === "Workload",
      async refresh() {
        const { items, total } = await apiAll(`/v1/workloads${params.toString() ? `?${params}` : ""}`, { keep: SHOWN });
        body.replaceChildren(
          h("p", { class: "muted", id: "workload-count" }, total > SHOWN ? `${total} workloads; the newest ${SHOWN} shown` : `${total} workload(s)`),
          table(
            ["workload", "tenant", "phase", "node", "cpuset", "devices", "reason"],
            items.slice().reverse().map((w) => {
              const key = `${w.metadata.namespace}/${w.metadata.name}`;
              const binding = w.status.binding || {};
              return h(
                "tr",
                { "data-workload": key },
                [workloadLink(key), w.status.tenant, phaseBadge(w.status.phase), nodeLink(w.status.node), binding.cpuset || "", devicesText(binding.devices), w.status.reason || ""].map((c) => h("td", {}, c)),
              );
            }),
            { empty: "no workloads match", cls: "workloads" },
          ),
        );
      },
    };
    return page;
  },
};

export function devicesText(devices) {
  return Object.entries(devices || {})
    .flatMap(([kind, grants]) => grants.map((g) => grantText(kind, g.minor, g.resources, g.mig)))
    .join("; ");
}

export const detail = {
  mount(main, [namespace, name]) {
    const key = `${namespace}/${name}`;
    const root = h("div", { id: "workload-page" }, h("p", { class: "muted" }, "Loading…"));
    main.replaceChildren(root);
    return {
      wants: (event) => event.kind === "Workload" && event.object === key,
      async refresh() {
        const path = `/v1/workloads/${encodeURIComponent(namespace)}/${encodeURIComponent(name)}`;
        const [w, events] = await Promise.all([api(path), api(`/v1/events?kind=Workload&object=${encodeURIComponent(key)}`)]);
        const output = w.status.node ? await tail(`${path}/logs?tail=${TAIL}`) : { error: "not placed on a node yet: no output" };
        root.replaceChildren(...draw(key, w, events.items, output));
      },
    };
  },
};

const TAIL = 200;

// The last lines of the workload's output, relayed by the server from its node's agent, or why not.
async function tail(path) {
  try {
    return { text: await apiText(path) };
  } catch (error) {
    return { error: typeof error.detail === "string" ? error.detail : error.message, status: error.status };
  }
}

function draw(key, w, events, output) {
  const st = w.status;
  const b = st.binding;
  return [
    h("h1", {}, `Workload ${key} `, phaseBadge(st.phase)),
    keyValues([
      ["tenant", st.tenant],
      ["phase", st.phase],
      ["reason", st.reason || "-"],
      ["job", st.job ? h("a", { href: `/ui/jobs/${st.job}` }, st.job) : null],
      ["submitted", st.created],
      ["updated", st.updated],
    ]),
    section(
      "Binding",
      b
        ? [
            keyValues([
              ["node", nodeLink(b.node)],
              ["acknowledged by the agent", b.acked ? "yes" : "not yet"],
              ["cpuset", h("code", { id: "binding-cpuset" }, b.cpuset || "shared pool")],
              ["NUMA", b.numa.length ? b.numa.map((g) => `numa ${g.numa}: ${resourceAmounts(g.resources)}`).join("; ") : "-"],
              ["requests", resourceAmounts(b.requests)],
            ]),
            table(
              ["device", "minor", "grant"],
              Object.entries(b.devices || {}).flatMap(([kind, grants]) => grants.map((g) => [kind, String(g.minor), Object.entries(g.resources).map(([d, v]) => `${d} ${deviceAmount(d, v)}`).join(", ")])),
              { empty: "no devices", cls: "binding-devices" },
            ),
          ]
        : h("p", { class: "muted" }, "not bound"),
    ),
    section("Events", table(["time", "reason", "message"], events.map((e) => [e.time, e.reason, e.message]), { empty: "no events", cls: "events" })),
    section("Applied by the node agent", Object.keys(st.info || {}).length ? keyValues(Object.entries(st.info).map(([k, v]) => [k, typeof v === "object" ? JSON.stringify(v) : String(v)])) : h("p", { class: "muted" }, "nothing reported yet")),
    section(`Output (the last ${TAIL} lines)`, logs(key, output)),
    h("details", {}, h("summary", {}, "spec"), h("pre", { class: "json" }, JSON.stringify(w.spec, null, 2))),
  ];
}

function logs(key, output) {
  if (output.error) {
    return h("p", { class: "muted", id: "workload-logs" }, `No output shown: ${output.error}`, output.status ? ` (${output.status})` : "");
  }
  return [
    h("pre", { class: "logs", id: "workload-logs" }, output.text || "(no output yet)"),
    h("p", { class: "muted" }, "The whole output: ", h("code", {}, `finesched logs ${key} --follow`)),
  ];
}
