// The dpkit curator dashboard: plain JavaScript as native ES modules, no framework, no build step.
//
// It holds no data of its own: everything shown comes from the /v1 API with the API key the user
// types in (kept in sessionStorage only, for this tab). All server-provided text is put into the
// page with textContent / text nodes, never parsed as HTML: dataset and analyst names, query text
// and audit outcomes come from users. This module wires the page; the others are:
// ui.js (DOM helpers), state.js, api.js, session.js, curator.js, chart.js, analyst.js, result.js.

import { preview, run, showSchema } from "./analyst.js";
import { ApiError, describe, onKeyRejected } from "./api.js";
import { verifyLog } from "./curator.js";
import { onLogin, refresh, signIn, signOut } from "./session.js";
import { STORAGE_KEY } from "./state.js";
import { $ } from "./ui.js";

function start() {
  onKeyRejected((message) => signOut(message));
  $("login-form").addEventListener("submit", onLogin);
  $("logout").addEventListener("click", () => signOut(null));
  $("refresh").addEventListener("click", () => refresh());
  $("verify-log").addEventListener("click", verifyLog);
  $("query-form").addEventListener("submit", run);
  $("query-preview").addEventListener("click", preview);
  $("query-dataset").addEventListener("change", showSchema);
  $("query-sql").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) run(event);
  });

  let saved = null;
  try {
    saved = sessionStorage.getItem(STORAGE_KEY);
  } catch (err) {
    saved = null;
  }
  if (!saved) {
    $("api-key").focus();
    return;
  }
  signIn(saved, { remembered: true }).catch((err) => {
    signOut(err instanceof ApiError && err.status === 401 ? "Your saved key is no longer accepted. Sign in again." : describe(err));
  });
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
