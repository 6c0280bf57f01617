// The /v1 API as the dashboard calls it: every request carries the key typed in; errors become
// ApiError with the server's code and message.

import { $, setNotice } from "./ui.js";
import { state } from "./state.js";

/** Called (with a message for the user) when the key is refused while signed in. */
let keyRejected = () => {};

/** Set what happens when the key stops being accepted (it was revoked while signed in). */
export function onKeyRejected(handler) {
  keyRejected = handler;
}

export class ApiError extends Error {
  constructor(status, code, message, body) {
    super(message);
    this.status = status;
    this.code = code;
    this.body = body || {};
  }
}

export async function api(path, options = {}) {
  const headers = { Accept: "application/json", Authorization: `Bearer ${state.key}` };
  const init = { method: options.method || "GET", headers, cache: "no-store", credentials: "omit" };
  if (options.body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(options.body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, "network", `the server could not be reached (${err.message})`);
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch (err) {
      data = null;
    }
  }
  if (!response.ok) {
    const body = data && typeof data.error === "object" && data.error ? data.error : {};
    const message = typeof body.message === "string" ? body.message : `${response.status} ${response.statusText}`;
    const error = new ApiError(response.status, body.code || `http_${response.status}`, message, body);
    if (response.status === 401 && state.me && !options.login) {
      // The key was revoked while we were signed in.
      setTimeout(() => keyRejected(`Your key is no longer accepted (${message}). Sign in again.`), 0);
    }
    throw error;
  }
  if (data === null) throw new ApiError(response.status, "bad_response", "the server's answer is not JSON");
  return data;
}

export const ERROR_TITLES = {
  budget_exceeded: "Budget exceeded",
  invalid_request: "Invalid request",
  not_found: "Not found",
  forbidden: "Not allowed",
  unauthenticated: "Not signed in",
  rate_limited: "Too many requests",
  too_large: "Request too large",
  ledger_unavailable: "Ledger unavailable",
  network: "Network error",
};

export function describe(err) {
  if (!(err instanceof ApiError)) return `Unexpected error: ${err && err.message ? err.message : err}`;
  const title = ERROR_TITLES[err.code] || `Error ${err.status}`;
  return `${title}: ${err.message}`;
}

/** Run `task`; show its failure in the notice `errorId` (and clear that notice on success). */
export async function guarded(errorId, task) {
  try {
    await task();
    setNotice($(errorId), null);
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) return;
    setNotice($(errorId), describe(err), "error");
  }
}

/** The newest `keep` entries of /v1/audit or /v1/history, newest first. */
export async function loadNewest(path, keep) {
  const data = await api(`${path}?newest=true&limit=${keep}`);
  return Array.isArray(data.entries) ? data.entries : [];
}
