# Shared by the setup scripts of peers that need a virtualenv of their own (setup_tumult.sh,
# setup_synth_peers.sh): source it, then call
#
#   peer_venv VENV STAMP TIMEOUT SCRIPT PACKAGE...
#
# It creates VENV (with a .gitignore of "*" inside, so git never sees it) from $PYTHON, and installs
# the PACKAGEs with at most TIMEOUT seconds for pip, unless STAMP is newer than SCRIPT. Returns 0
# when it installed them (the caller prints the versions and touches STAMP) and 2 when VENV was
# already up to date; a failed or slow install exits 1.
peer_venv() {
    local venv="$1" stamp="$2" timeout="$3" script="$4"
    shift 4
    local bin="$venv/bin"
    if [ ! -x "$bin/python" ]; then
        echo "creating $venv"
        "${PYTHON:-python3}" -m venv "$venv"
        echo "*" >"$venv/.gitignore"
        "$bin/python" -m pip install --quiet --upgrade pip
    fi
    if [ -f "$stamp" ] && [ "$stamp" -nt "$script" ]; then
        echo "$venv is up to date"
        return 2
    fi
    echo "installing $* into $venv (at most ${timeout}s)"
    local start=$SECONDS
    if ! timeout "$timeout" "$bin/python" -m pip install --quiet "$@"; then
        echo "pip install failed or took longer than ${timeout}s (after $((SECONDS - start))s)" >&2
        exit 1
    fi
    echo "installed in $((SECONDS - start))s"
}
