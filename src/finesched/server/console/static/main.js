// The console's entry: sign-in, which page the path names, and live refresh from the event watch.
//
// Every page module exports `mount(main, params, who)` returning {refresh(), wants(event)} and
// optionally `periodic` and `minInterval`: refresh() draws the page from the API; wants(event) says
// whether an event may have changed it. Pages redraw without a reload: events are debounced into
// at most one refresh in flight, and pages whose subject other tenants can change (the overview, a
// node: a tenant's watch carries only its own events) also refresh every 15 s.

import { api, signOut, token, watchEvents } from "./api.js";
import { errorBox, h } from "./dom.js";
import * as jobs from "./jobs.js";
import * as nodePage from "./node.js";
import * as overview from "./overview.js";
import * as plan from "./plan.js";
import * as signin from "./signin.js";
import * as workloads from "./workloads.js";

const ROUTES = [
  [/^\/ui\/?$/, overview, "overview"],
  [/^\/ui\/nodes\/([^/]+)$/, nodePage, "overview"],
  [/^\/ui\/workloads\/?$/, workloads.list, "workloads"],
  [/^\/ui\/workloads\/([^/]+)\/([^/]+)$/, workloads.detail, "workloads"],
  [/^\/ui\/jobs\/?$/, jobs.list, "jobs"],
  [/^\/ui\/jobs\/([^/]+)\/([^/]+)$/, jobs.detail, "jobs"],
  [/^\/ui\/plan\/?$/, plan, "plan"],
  [/^\/ui\/signin\/?$/, signin, ""],
];
const PERIODIC_MS = 15000;
const DEBOUNCE_MS = 300;

function route(path) {
  for (const [pattern, page, nav] of ROUTES) {
    const match = pattern.exec(path);
    if (match) return { page, nav, params: match.slice(1).map(decodeURIComponent) };
  }
  return null;
}

function setLive(state) {
  const live = document.getElementById("live");
  live.textContent = state === "live" ? "● live" : state === "reconnecting" ? "◌ reconnecting" : "○ offline";
  live.className = `live ${state}`;
  document.body.dataset.live = state;
}

// Count renders, so tests and the benchmark know when a page has drawn (data-rendered on <body>);
// the first one is marked for the benchmark (bench/console.py): "finesched-rendered" when the DOM
// holds the data, "finesched-painted" two animation frames later, once the browser painted it.
function rendered() {
  const count = Number(document.body.dataset.rendered || 0) + 1;
  document.body.dataset.rendered = String(count);
  if (count !== 1) return;
  performance.mark("finesched-rendered");
  requestAnimationFrame(() => requestAnimationFrame(() => performance.mark("finesched-painted")));
}

async function start() {
  const main = document.getElementById("main");
  const found = route(location.pathname);
  if (!found) {
    main.replaceChildren(h("p", {}, "No such page. "), h("a", { href: "/ui" }, "Overview"));
    return;
  }
  if (found.page === signin) {
    found.page.mount(main);
    return;
  }
  if (!token()) {
    location.replace(`/ui/signin?next=${encodeURIComponent(location.pathname + location.search)}`);
    return;
  }
  let who;
  try {
    who = await api("/ui/api/whoami");
  } catch (error) {
    if (error.status === 401 || error.status === 403) {
      signOut();
      location.replace(`/ui/signin?next=${encodeURIComponent(location.pathname)}&why=${error.status}`);
      return;
    }
    main.replaceChildren(errorBox(error));
    return;
  }
  document.getElementById("who").textContent = who.role === "tenant" ? `tenant ${who.tenant}` : who.role;
  const out = document.getElementById("signout");
  out.hidden = false;
  out.addEventListener("click", () => {
    signOut();
    location.assign("/ui/signin");
  });
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.nav === found.nav);

  const page = found.page.mount(main, found.params, who);
  const banner = h("div", { id: "banner" });
  main.before(banner);
  let running = null;
  let again = false;
  // Draw the page again; an error (the server down, a refused read) shows above it until a draw succeeds.
  async function refresh() {
    if (running) {
      again = true;
      return;
    }
    running = page
      .refresh()
      .then(() => {
        banner.replaceChildren();
        rendered();
      })
      .catch((error) => {
        banner.replaceChildren(errorBox(error));
        rendered();
      });
    await running;
    running = null;
    if (again) {
      again = false;
      refresh();
    }
  }
  // The first relevant event schedules one redraw (events arriving meanwhile join it), a little
  // later and at most every `page.minInterval` ms: a busy cluster binds hundreds of workloads a
  // second, and the overview of 10,000 nodes is not redrawn for each of them.
  let timer = null;
  let last = 0;
  watchEvents((event) => {
    if (timer !== null || !page.wants(event)) return;
    const wait = Math.max(DEBOUNCE_MS, last + (page.minInterval || 0) - Date.now());
    timer = setTimeout(() => {
      timer = null;
      last = Date.now();
      refresh();
    }, wait);
  }, setLive);
  if (page.periodic) setInterval(refresh, PERIODIC_MS);
  await refresh();
}

start();
