// Dataflow jobs: the list and one job with its slot sharing groups, slots and their phases.
//
// The job endpoints (GET /v1/jobs, GET /v1/jobs/{ns}/{name}) are used when the server has them;
// until then a job is what the API keeps of it: its slot workloads (GET /v1/workloads?job=ns/name),
// each labelled with its slot sharing group and slot index. Regions are shown when the job endpoint
// reports them; the slots alone do not say which region a group came from.

import { ApiError, api } from "./api.js";
import { amounts, h, keyValues, nodeLink, phaseBadge, section, table, workloadLink } from "./dom.js";
import { devicesText } from "./workloads.js";

const GROUP = "finesched.io/slot-sharing-group";
const SLOT = "finesched.io/slot-index";

// The server's answer for `path`, or null where it has no such route (404 / 405).
async function optional(path) {
  try {
    return await api(path);
  } catch (error) {
    if (error instanceof ApiError && (error.status === 404 || error.status === 405)) return null;
    throw error;
  }
}

function phaseOf(slots) {
  const phases = new Set(slots.map((w) => w.status.phase));
  for (const p of ["Failed", "Rejected", "Pending", "Bound", "Running"]) if (phases.has(p)) return p;
  return phases.size ? [...phases][0] : "-";
}

const PHASES = ["", "Pending", "Bound", "Running", "Succeeded", "Failed", "Rejected"];

export const list = {
  mount(main, _params, who) {
    const query = new URLSearchParams(location.search);
    const tenant = h("input", { name: "tenant", id: "job-tenant", placeholder: "any tenant", value: who.role === "tenant" ? who.tenant : query.get("tenant") || "", disabled: who.role === "tenant" });
    const phase = h("select", { name: "phase", id: "job-phase" }, PHASES.map((p) => h("option", { value: p, selected: p === (query.get("phase") || "") }, p || "any phase")));
    const node = h("input", { name: "node", id: "job-node", placeholder: "any node", value: query.get("node") || "" });
    const form = h("form", { class: "filters" }, tenant, phase, node, h("button", { type: "submit" }, "Filter"));
    const body = h("div", { id: "job-list" }, h("p", { class: "muted" }, "Loading…"));
    main.replaceChildren(h("h1", {}, "Jobs"), form, body);
    const page = {
      minInterval: 2000,
      wants: (event) => event.kind === "Workload",
      async refresh() {
        const params = new URLSearchParams();
        if (tenant.value && !tenant.disabled) params.set("tenant", tenant.value);
        const all = (await api(`/v1/workloads${params.toString() ? `?${params}` : ""}`)).items;
        const workloads = all.filter((w) => w.status.job);
        const jobs = new Map();
        for (const w of workloads) {
          if (!jobs.has(w.status.job)) jobs.set(w.status.job, []);
          jobs.get(w.status.job).push(w);
        }
        const shown = [...jobs].filter(
          ([, slots]) => (!phase.value || phaseOf(slots) === phase.value) && (!node.value || slots.some((w) => w.status.node === node.value)),
        );
        body.replaceChildren(
          table(
            ["job", "tenant", "phase", "slots", "groups"],
            shown.map(([key, slots]) => [
              h("a", { href: `/ui/jobs/${key}` }, key),
              slots[0].status.tenant,
              phaseBadge(phaseOf(slots)),
              String(slots.length),
              [...new Set(slots.map((w) => (w.metadata.labels || {})[GROUP] || "-"))].join(", "),
            ]),
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
      wants: (event) => event.kind === "Workload" && event.object.startsWith(`${namespace}/${name}-`),
      async refresh() {
        const [job, slots] = await Promise.all([
          optional(`/v1/jobs/${encodeURIComponent(namespace)}/${encodeURIComponent(name)}`),
          api(`/v1/workloads?job=${encodeURIComponent(key)}`),
        ]);
        root.replaceChildren(...draw(key, job, slots.items));
      },
    };
  },
};

function draw(key, job, slots) {
  if (!slots.length && !job) return [h("h1", {}, `Job ${key}`), h("p", { class: "muted" }, "no such job (or not yours)")];
  const groups = new Map();
  for (const w of slots) {
    const group = (w.metadata.labels || {})[GROUP] || "-";
    if (!groups.has(group)) groups.set(group, []);
    groups.get(group).push(w);
  }
  const status = (job && job.status) || {};
  return [
    h("h1", {}, `Job ${key} `, phaseBadge(status.phase || phaseOf(slots))),
    keyValues([
      ["tenant", slots.length ? slots[0].status.tenant : "-"],
      ["slots", String(slots.length)],
      ["slot sharing groups", String(groups.size)],
    ]),
    section("Regions", regions(status)),
    section(
      "Slot sharing groups",
      table(
        ["group", "slots", "phases", "requests per slot"],
        [...groups].map(([group, members]) => [
          group,
          String(members.length),
          [...new Set(members.map((w) => w.status.phase))].join(", "),
          amounts(members[0].spec.requests),
        ]),
        { cls: "groups" },
      ),
    ),
    section(
      "Slots",
      table(
        ["slot", "group", "index", "phase", "node", "cpuset", "devices", "reason"],
        slots.map((w) => {
          const labels = w.metadata.labels || {};
          const b = w.status.binding || {};
          return [
            workloadLink(`${w.metadata.namespace}/${w.metadata.name}`),
            labels[GROUP] || "-",
            labels[SLOT] || "-",
            phaseBadge(w.status.phase),
            nodeLink(w.status.node),
            b.cpuset || "",
            devicesText(b.devices),
            w.status.reason || "",
          ];
        }),
        { cls: "slots" },
      ),
    ),
  ];
}

function regions(status) {
  if (Array.isArray(status.regions)) {
    return table(
      ["region", "details"],
      status.regions.map((r, i) => [String(r.id ?? r.name ?? i), typeof r === "object" ? JSON.stringify(r) : String(r)]),
    );
  }
  if (status.regions && typeof status.regions === "object") {
    return keyValues(Object.entries(status.regions).map(([k, v]) => [k, typeof v === "object" ? JSON.stringify(v) : String(v)]));
  }
  return h(
    "p",
    { class: "muted" },
    "This server does not report a job's pipelined regions yet (the job endpoint is not there); ",
    "groups named region-N are the regions' default groups (finesched job plan shows them all).",
  );
}
