// Dataflow jobs: the list (GET /v1/jobs; filters: tenant, phase, node) and one job (GET
// /v1/jobs/{ns}/{name}): its failover regions with their tasks, slots, phases and restarts, its
// slot sharing groups (from its slot workloads, GET /v1/workloads?job=ns/name, which also give each
// slot's binding) and its events.

import { api, apiAll } from "./api.js";
import { h, keyValues, nodeLink, phaseBadge, resourceAmounts, section, table, workloadLink } from "./dom.js";
import { devicesText } from "./workloads.js";

const GROUP = "finesched.io/slot-sharing-group";
const SLOT = "finesched.io/slot-index";
const PHASES = ["", "Pending", "Starting", "Running", "Restarting", "Succeeded", "Failed"];
const SLOT_PHASES = ["Pending", "Bound", "Running", "Succeeded", "Failed", "Rejected"];

function counts(slots) {
  return SLOT_PHASES.filter((p) => slots[p]).map((p) => `${slots[p]} ${p}`).join(", ") || "-";
}

export const list = {
  mount(main, _params, who) {
    const query = new URLSearchParams(location.search);
    const mine = who.role === "tenant";
    const tenant = h("input", { name: "tenant", id: "job-tenant", placeholder: "any tenant", value: mine ? who.tenant : query.get("tenant") || "", disabled: mine });
    const phase = h("select", { name: "phase", id: "job-phase" }, PHASES.map((p) => h("option", { value: p, selected: p === (query.get("phase") || "") }, p || "any phase")));
    const node = h("input", { name: "node", id: "job-node", placeholder: "any node", value: query.get("node") || "" });
    const form = h("form", { class: "filters" }, tenant, phase, node, h("button", { type: "submit" }, "Filter"));
    const body = h("div", { id: "job-list" }, h("p", { class: "muted" }, "Loading…"));
    main.replaceChildren(h("h1", {}, "Jobs"), form, body);
    const page = {
      minInterval: 2000,
      wants: (event) => event.kind === "Workload" || event.kind === "Job",
      async refresh() {
        const jobs = (await apiAll("/v1/jobs")).items.filter((job) => {
          const st = job.status;
          const nodes = st.regions.flatMap((r) => r.slots.map((slot) => slot.node));
          return (mine || !tenant.value || st.tenant === tenant.value) && (!phase.value || st.phase === phase.value) && (!node.value || nodes.includes(node.value));
        });
        body.replaceChildren(
          table(
            ["job", "tenant", "phase", "slots", "regions", "restarts", "reason"],
            jobs.map((job) => {
              const key = `${job.metadata.namespace}/${job.metadata.name}`;
              const st = job.status;
              return [h("a", { href: `/ui/jobs/${key}` }, key), st.tenant, phaseBadge(st.phase), `${st.slots.total}: ${counts(st.slots)}`, String(st.regions.length), `${st.failures}/${st.backoffLimit}`, st.reason || ""];
            }),
            { empty: "no dataflow jobs match (finesched job submit)", cls: "jobs" },
          ),
        );
      },
    };
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      page.refresh();
    });
    return page;
  },
};

export const detail = {
  mount(main, [namespace, name]) {
    const key = `${namespace}/${name}`;
    const root = h("div", { id: "job-page" }, h("p", { class: "muted" }, "Loading…"));
    main.replaceChildren(root);
    return {
      minInterval: 1000,
      wants: (event) => (event.kind === "Job" && event.object === key) || (event.kind === "Workload" && event.object.startsWith(`${key}-`)),
      async refresh() {
        const [job, slots] = await Promise.all([
          api(`/v1/jobs/${encodeURIComponent(namespace)}/${encodeURIComponent(name)}`),
          apiAll(`/v1/workloads?job=${encodeURIComponent(key)}`),
        ]);
        root.replaceChildren(...draw(key, job, slots.items));
      },
    };
  },
};

function draw(key, job, workloads) {
  const st = job.status;
  const byKey = new Map(workloads.map((w) => [`${w.metadata.namespace}/${w.metadata.name}`, w]));
  const groups = new Map();
  for (const w of workloads) {
    const group = (w.metadata.labels || {})[GROUP] || "-";
    if (!groups.has(group)) groups.set(group, []);
    groups.get(group).push(w);
  }
  return [
    h("h1", {}, `Job ${key} `, phaseBadge(st.phase)),
    keyValues([
      ["tenant", st.tenant],
      ["mode", job.spec.mode || "streaming"],
      ["reason", st.reason || "-"],
      ["slots", `${st.slots.total}: ${counts(st.slots)}`],
      ["restarts", `${st.failures} of ${st.backoffLimit} (restartPolicy ${st.restartPolicy})`],
    ]),
    section(
      "Failover regions (a failed slot restarts its region only)",
      table(
        ["region", "tasks", "slot", "group", "phase", "node", "restarts"],
        st.regions.flatMap((region) =>
          region.slots.map((slot, i) => {
            const labels = (byKey.get(slot.workload) || { metadata: {} }).metadata.labels || {};
            return [
              i ? "" : `${region.index}${region.restarting ? " (restarting)" : ""}`,
              i ? "" : region.tasks.join(", "),
              workloadLink(slot.workload),
              labels[GROUP] || "-",
              phaseBadge(slot.phase),
              nodeLink(slot.node),
              i ? "" : String(region.restarts),
            ];
          }),
        ),
        { cls: "regions" },
      ),
    ),
    section(
      "Slot sharing groups",
      table(
        ["group", "slots", "phases", "requests per slot"],
        [...groups].map(([group, members]) => [group, String(members.length), [...new Set(members.map((w) => w.status.phase))].join(", "), resourceAmounts(members[0].spec.requests)]),
        { cls: "groups" },
      ),
    ),
    section(
      "Slots",
      table(
        ["slot", "group", "index", "phase", "node", "cpuset", "devices", "reason"],
        workloads.map((w) => {
          const labels = w.metadata.labels || {};
          const b = w.status.binding || {};
          return [workloadLink(`${w.metadata.namespace}/${w.metadata.name}`), labels[GROUP] || "-", labels[SLOT] || "-", phaseBadge(w.status.phase), nodeLink(w.status.node), b.cpuset || "", devicesText(b.devices), w.status.reason || ""];
        }),
        { cls: "slots" },
      ),
    ),
    section("Events", table(["time", "object", "reason", "count", "message"], (job.events || []).map((e) => [e.time, e.object, e.reason, String(e.count || 1), e.message]), { empty: "no events", cls: "events" })),
  ];
}
