#!/usr/bin/env bash
# Prints the path of a system Chromium for the dashboard's browser test (Playwright drives it
# through executable_path; no browser is downloaded). Looks for chromium, chromium-browser and
# google-chrome on PATH; when none runs and this is root with apt-get, installs Debian's
# chromium package. Only the path goes to stdout; exits 1 with a message on stderr otherwise.
set -uo pipefail

find_browser() {
    local name path
    for name in chromium chromium-browser google-chrome google-chrome-stable; do
        path="$(command -v "$name" 2>/dev/null)" || continue
        # Ubuntu's chromium-browser may be a stub that only points to a snap: check it runs.
        if "$path" --version >/dev/null 2>&1; then
            printf '%s\n' "$path"
            return 0
        fi
    done
    return 1
}

find_browser && exit 0

if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "no Chromium on PATH; installing Debian's chromium package (apt-get install -y chromium)" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y chromium >&2; then
        apt-get update >&2 && apt-get install -y chromium >&2
    fi
    find_browser && exit 0
    echo "apt-get could not install a working chromium" >&2
    exit 1
fi

echo "no Chromium found (chromium, chromium-browser, google-chrome on PATH) and it cannot be installed here" >&2
echo "(installing needs root and apt-get: apt-get install -y chromium); or set DPKIT_CHROMIUM to a Chromium binary" >&2
exit 1
