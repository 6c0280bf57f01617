#!/usr/bin/env bash
# Private analytics from the command line: a census-like table with several rows per person,
# one analyst's budget in the SQLite ledger, queries paid for one by one until the budget is
# spent and the next query is refused.  `make demo` runs this script.
#
#   bash examples/census_queries.sh [OUT_DIR]        (default out/demo; uses .venv/bin/dpkit)
set -euo pipefail
OUT=${1:-out/demo}
DPKIT=${DPKIT:-.venv/bin/dpkit}
LEDGER="$OUT/ledger.sqlite"
mkdir -p "$OUT"
rm -f "$LEDGER"

run() { printf '\n$ %s\n' "$*"; "$@"; }

run "$DPKIT" generate census "$OUT/census.csv" --people 20000 --metadata "$OUT/census.json"
# The budget belongs to the file's content (a copy or a renamed file pays from the same budget).
run "$DPKIT" budget create "$OUT/census.csv" demo --epsilon 1.5 --delta 1e-6 --ledger "$LEDGER"

Q() { run "$DPKIT" query "$OUT/census.csv" "$1" --epsilon "$2" ${3:+--delta "$3"} --metadata "$OUT/census.json" --ledger "$LEDGER" --analyst demo; }

Q "SELECT sex, COUNT(*) AS jobs, COUNT(DISTINCT person_id) AS people, AVG(age) FROM census WHERE age > 30 GROUP BY sex" 0.5
Q "SELECT education, AVG(income) AS mean_income, MEDIAN(income) AS median_income FROM census GROUP BY education" 0.5
Q "SELECT marital_status, COUNT(*) FROM census GROUP BY marital_status" 0.25
Q "SELECT STDDEV(hours_per_week), QUANTILE_CONT(hours_per_week, 0.9) FROM census WHERE sector IN ('Private', 'Public')" 0.25

printf '\n# The budget (ε = 1.5) is now spent; the next query is refused before any noise is drawn:\n'
if Q "SELECT COUNT(*) FROM census" 0.1; then
  echo "unexpected: the query was answered" >&2; exit 1
fi

run "$DPKIT" budget --ledger "$LEDGER" --dataset "$OUT/census.csv" --analyst demo
