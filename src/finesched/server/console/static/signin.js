// Sign in with a token (`finesched token create` prints one; `finesched up` writes the admin's).
// The token is checked against the server before it is kept, and kept for this tab only.

import { api, signIn, signOut } from "./api.js";
import { errorBox, h } from "./dom.js";

export function mount(main) {
  const params = new URLSearchParams(location.search);
  const next = safeNext(params.get("next"));
  const input = h("input", {
    id: "token",
    type: "password",
    autocomplete: "off",
    placeholder: "fs_…",
    required: true,
    "aria-label": "token",
  });
  const message = h("div", { id: "signin-message" });
  if (params.get("why")) message.append(errorBox({ detail: "that token is not accepted here; sign in again" }));
  const form = h(
    "form",
    { class: "card signin", id: "signin" },
    h("h2", {}, "Sign in"),
    h("p", { class: "muted" }, "An admin token sees the whole cluster; a tenant token sees the nodes and its own workloads."),
    h("label", { for: "token" }, "Token"),
    input,
    h("button", { type: "submit" }, "Sign in"),
    message,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    signIn(input.value);
    try {
      await api("/ui/api/whoami");
    } catch (error) {
      signOut();
      message.replaceChildren(errorBox(error.status === 401 ? { detail: "unknown token" } : error));
      return;
    }
    location.assign(next);
  });
  main.replaceChildren(form);
  input.focus();
}

// Only console paths of this server are followed after signing in.
function safeNext(next) {
  return next && next.startsWith("/ui") && !next.startsWith("//") ? next : "/ui";
}
