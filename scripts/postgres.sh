#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the test suite and the benchmarks.
#
#   scripts/postgres.sh start   # install (Debian, as root) if needed, start; print the URL
#   scripts/postgres.sh url     # print the URL of the running cluster (exit 1 if none)
#   scripts/postgres.sh stop    # stop it and delete its directory
#
# The cluster lives in a temporary directory, listens on 127.0.0.1 only (port $DPKIT_PG_PORT,
# default 55432) and trusts local connections: it is for tests, never for real data. Everything
# but the URL goes to stderr, so `url=$(scripts/postgres.sh start)` works.
set -euo pipefail

PORT="${DPKIT_PG_PORT:-55432}"
DIR="${DPKIT_PG_DIR:-${TMPDIR:-/tmp}/dpkit-postgres-$(id -u)-$PORT}"
USER_NAME=dpkit
DB=dpkit_test
URL="postgresql://$USER_NAME@127.0.0.1:$PORT/$DB"

log() { echo "postgres.sh: $*" >&2; }

find_bin() {
    local name=$1 found
    found=$(command -v "$name" 2>/dev/null || true)
    if [ -z "$found" ]; then
        found=$(ls -d /usr/lib/postgresql/*/bin/"$name" 2>/dev/null | sort -V | tail -1 || true)
    fi
    echo "$found"
}

# The server refuses to run as root: run its tools as the 'postgres' account when we are root.
as_owner() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

ready() { "$(find_bin pg_isready)" -q -h 127.0.0.1 -p "$PORT" >/dev/null 2>&1; }

install() {
    if [ -n "$(find_bin initdb)" ]; then return 0; fi
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "installing Debian's postgresql package"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2 || return 1
        [ -n "$(find_bin initdb)" ]
    else
        log "PostgreSQL is not installed and cannot be installed here (needs root and apt-get)"
        return 1
    fi
}

start() {
    if ready; then echo "$URL"; return 0; fi
    install || return 1
    local initdb pg_ctl
    initdb=$(find_bin initdb)
    pg_ctl=$(find_bin pg_ctl)
    if [ "$(id -u)" = 0 ] && ! getent passwd postgres >/dev/null; then
        log "running as root but there is no 'postgres' account to run the server as"
        return 1
    fi
    if [ ! -f "$DIR/data/PG_VERSION" ]; then
        rm -rf "$DIR"
        mkdir -p "$DIR"
        [ "$(id -u)" = 0 ] && chown postgres "$DIR"
        as_owner "$initdb" -D "$DIR/data" -A trust -U "$USER_NAME" -E UTF8 >/dev/null
    fi
    as_owner "$pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
        -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=on" start >&2
    "$(find_bin createdb)" -h 127.0.0.1 -p "$PORT" -U "$USER_NAME" "$DB" 2>/dev/null || true
    echo "$URL"
}

stop() {
    if [ -f "$DIR/data/PG_VERSION" ]; then
        as_owner "$(find_bin pg_ctl)" -D "$DIR/data" -m fast -w stop >&2 || true
    fi
    rm -rf "$DIR"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    url) if ready; then echo "$URL"; else exit 1; fi ;;
    *) echo "usage: $0 start|url|stop" >&2; exit 2 ;;
esac
