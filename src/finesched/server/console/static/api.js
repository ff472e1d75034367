// The console's only way to the server: the /v1 API and /ui/api, with the signed-in token as a
// Bearer header (kept in this tab's sessionStorage; never in a cookie, so no other site can use it).

const TOKEN_KEY = "finesched.token";

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function signIn(value) {
  sessionStorage.setItem(TOKEN_KEY, value.trim());
}

export function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
}

export class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : `HTTP ${status}`);
    this.status = status;
    this.detail = detail; // a string, or FastAPI's [{loc, msg, input}] for bad input
  }
}

// GET (or `method`) `path`; the answer's JSON, or an ApiError with the server's detail.
export async function api(path, { method = "GET", body, contentType } = {}) {
  const headers = { Authorization: `Bearer ${token()}` };
  let payload;
  if (body !== undefined) {
    headers["Content-Type"] = contentType || "application/json";
    payload = contentType ? body : JSON.stringify(body);
  }
  const response = await fetch(path, { method, headers, body: payload });
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    throw new ApiError(response.status, data && data.detail !== undefined ? data.detail : response.statusText);
  }
  return data;
}

// Every item of a paged list (GET `path`: the server answers at most `limit` items a request, with
// metadata.continue for the next page), keeping only the newest `keep` (lists are oldest first);
// `total` counts them all.
export async function apiAll(path, { keep = Infinity, limit = 5000 } = {}) {
  const join = path.includes("?") ? "&" : "?";
  let items = [];
  let total = 0;
  let next = null;
  do {
    const page = await api(`${path}${join}limit=${limit}${next ? `&continue=${encodeURIComponent(next)}` : ""}`);
    total += page.items.length;
    items = items.concat(page.items);
    if (items.length > keep) items = items.slice(-keep);
    next = page.metadata && page.metadata.continue;
  } while (next);
  return { items, total };
}

// GET `path` as text (a workload's output); an ApiError with the server's detail when refused.
export async function apiText(path) {
  const response = await fetch(path, { headers: { Authorization: `Bearer ${token()}` } });
  if (!response.ok) {
    let detail = response.statusText;
    try {
      detail = (await response.json()).detail;
    } catch {
      // not JSON: keep the status text
    }
    throw new ApiError(response.status, detail);
  }
  return response.text();
}

// Follow the server's event watch (Server-Sent Events over fetch, so the token goes in a header,
// which EventSource cannot send). Calls onEvent(event) for each event and onState("live" |
// "reconnecting" | "offline"); reconnects with backoff, resuming after the last event seen.
export function watchEvents(onEvent, onState) {
  let lastId = null;
  let stopped = false;
  let controller = null;
  let delay = 500;

  async function connect() {
    while (!stopped) {
      controller = new AbortController();
      const headers = { Authorization: `Bearer ${token()}`, Accept: "text/event-stream" };
      if (lastId !== null) headers["Last-Event-ID"] = String(lastId);
      try {
        const response = await fetch("/v1/events/watch", { headers, signal: controller.signal });
        if (response.status === 401 || response.status === 403) {
          onState("offline");
          return;
        }
        if (!response.ok || !response.body) throw new Error(`watch answered ${response.status}`);
        onState("live");
        delay = 500;
        await readStream(response.body, (event) => {
          lastId = event.id;
          onEvent(event);
        });
      } catch (error) {
        if (stopped) return;
      }
      onState("reconnecting");
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 10000);
    }
  }

  connect();
  return () => {
    stopped = true;
    if (controller) controller.abort();
  };
}

// Parse an SSE stream: blocks separated by a blank line, `data:` lines holding one JSON event.
async function readStream(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data: "))
        .map((line) => line.slice(6))
        .join("\n");
      if (data) onEvent(JSON.parse(data));
    }
  }
}
