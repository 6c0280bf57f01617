// Signing in and out: the key is checked with /v1/me, then the curator's or the analyst's view
// is shown and loaded.

import { loadAnalyst } from "./analyst.js";
import { api, ApiError, describe } from "./api.js";
import { loadCurator } from "./curator.js";
import { resetState, state, STORAGE_KEY } from "./state.js";
import { $, setNotice } from "./ui.js";

function clearViews() {
  for (const id of ["datasets", "analysts", "budgets", "audit", "history"]) {
    const table = $(id);
    if (table) table.tBodies[0].replaceChildren();
  }
  $("spending-chart").replaceChildren();
  $("budget-cards").replaceChildren();
  $("query-dataset").replaceChildren();
  $("query-result").replaceChildren();
  $("query-schema").replaceChildren();
  for (const id of ["query-error", "query-cost", "verify-result"]) setNotice($(id), null);
  for (const id of ["tile-datasets", "tile-analysts", "tile-keys", "tile-budgets", "tile-budgets-note"]) $(id).textContent = "";
}

export async function signIn(key, { remembered = false } = {}) {
  state.key = key;
  const me = await api("/v1/me", { login: true });
  if (me.role !== "curator" && me.role !== "analyst") throw new ApiError(0, "bad_response", `unknown role ${me.role}`);
  try {
    sessionStorage.setItem(STORAGE_KEY, key);
  } catch (err) {
    /* storage disabled: the key lives in memory for this page only */
  }
  resetState();
  state.me = me;
  $("who-name").textContent = me.name;
  $("who-role").textContent = me.role;
  $("who-role").className = `badge role ${me.role}`;
  $("who-key").textContent = me.key_id ? `key ${me.key_id}` : "";
  $("whoami").hidden = false;
  $("login-view").hidden = true;
  $("curator-view").hidden = me.role !== "curator";
  $("analyst-view").hidden = me.role !== "analyst";
  document.title = `dpkit · ${me.name} (${me.role})`;
  if (!remembered) $("api-key").value = "";
  await refresh();
}

export function signOut(message) {
  try {
    sessionStorage.removeItem(STORAGE_KEY);
  } catch (err) {
    /* nothing stored */
  }
  state.key = null;
  resetState();
  clearViews();
  $("whoami").hidden = true;
  $("curator-view").hidden = true;
  $("analyst-view").hidden = true;
  $("login-view").hidden = false;
  document.title = "dpkit curator";
  $("api-key").value = "";
  setNotice($("login-error"), message || null, "error");
  $("api-key").focus();
}

export async function onLogin(event) {
  event.preventDefault();
  const key = $("api-key").value.trim();
  if (!key) {
    setNotice($("login-error"), "Enter your API key.", "error");
    return;
  }
  const button = $("login");
  button.disabled = true;
  setNotice($("login-error"), null);
  try {
    await signIn(key);
  } catch (err) {
    state.key = null;
    state.me = null;
    const text =
      err instanceof ApiError && err.status === 401
        ? `This key was not accepted: ${err.message}`
        : describe(err);
    setNotice($("login-error"), text, "error");
    $("api-key").select();
  } finally {
    button.disabled = false;
  }
}

export async function refresh() {
  if (!state.me) return;
  const button = $("refresh");
  button.disabled = true;
  try {
    if (state.me.role === "curator") await loadCurator();
    else await loadAnalyst();
  } finally {
    button.disabled = false;
  }
}
