// The dashboard's state: the API key (kept in sessionStorage only, for this tab), who is signed
// in, and what was last read from the API.

export const STORAGE_KEY = "dpkit.apiKey";
export const AUDIT_KEEP = 50;
export const HISTORY_KEEP = 200;

export const state = {
  key: null,
  me: null,
  datasets: [],
  budgets: [],
  busy: false,
};

export function resetState() {
  state.me = null;
  state.datasets = [];
  state.budgets = [];
}
