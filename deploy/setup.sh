#!/usr/bin/env bash
# The local single-host set-up, from a fresh clone to a running stack:
#
#   bash deploy/setup.sh [demo|test|none]     (default: none)
#
# 1. installs the Debian packages that are missing (apt-get update only then);
# 2. creates <repo>/.venv and installs the project with every extra, each package at its version
#    in requirements.lock (`pip install -c requirements.lock -e '.[dev,spark,demo]'`, which
#    compiles the C kernel), again only when pyproject.toml, requirements.lock, setup.py or
#    hilbert_c's C sources changed (a hash kept in .venv);
# 3. enables the RabbitMQ plugins (offline, before the node starts);
# 4. `geofence up`: RabbitMQ, a private PostgreSQL cluster, memcached, the Firebase Auth
#    emulator (npm firebase-tools, installed under the state dir the first time), Prometheus
#    (scraping every process's /metrics), the schema,
#    the pipeline's sidecars, the events archiver and the fence API;
# 5. demo: runs the demo; test: ruff, mypy, then pytest last; none: stops there.
#
# Idempotent: a second run skips what is done and takes a few seconds. Runs as root (apt,
# services started as the users rabbitmq, postgres and nobody), from any clone location.
set -euo pipefail

mode="${1:-none}"
case "$mode" in
    demo | test | none) ;;
    *)
        echo "usage: bash deploy/setup.sh [demo|test|none]" >&2
        exit 2
        ;;
esac

REPO="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
STAMP="$VENV/.geofence-install.sha256"
PLUGINS=(rabbitmq_mqtt rabbitmq_federation rabbitmq_management rabbitmq_shovel rabbitmq_federation_management rabbitmq_prometheus rabbitmq_consistent_hash_exchange)
ENABLED_PLUGINS=/etc/rabbitmq/enabled_plugins
PYTHON="${PYTHON:-python3}"
cd "$REPO"

say() { printf 'setup: %s\n' "$*"; }
die() {
    printf 'setup: error: %s\n' "$*" >&2
    exit 1
}

[ "$(id -u)" = 0 ] || die "run as root: it installs Debian packages and starts services"

# ---------------------------------------------------------------- Debian packages

pkg_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'
}

java_ok() {
    local v
    command -v java >/dev/null || return 1
    v="$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)"
    [ -n "$v" ] && [ "$v" -ge 17 ]
}

missing_packages() {
    local p
    # chromium + chromium-driver: the page tests' real browser (tests/integration/browser.py);
    # iproute2: the TLS tests' network namespace (a client outside this host's loopback);
    # libnss3-tools: certutil, so that the browser of the page tests trusts the stack's CA
    for p in rabbitmq-server memcached libpostgresql-jdbc-java gcc libc6-dev prometheus chromium \
             chromium-driver iproute2 libnss3-tools; do
        pkg_installed "$p" || echo "$p"
    done
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || echo postgresql
    # PySpark 4 (the nightly jobs, spark_jobs/) runs on Java 17 or newer
    java_ok || echo openjdk-17-jre-headless
    # npm installs the Firebase Auth emulator (firebase-tools, Node >= 20) on the first `up`
    command -v npm >/dev/null || echo nodejs npm
    if ! command -v "$PYTHON" >/dev/null; then
        echo python3 python3-venv python3-dev
    elif [ "$(command -v "$PYTHON")" = /usr/bin/python3 ]; then
        # Debian's own python3 ships venv and the C headers separately.
        pkg_installed python3-venv || echo python3-venv
        pkg_installed python3-dev || echo python3-dev
    fi
}

# A package's postinst must not start RabbitMQ or memcached behind our back: `geofence up`
# starts them, and records that it did. policy-rc.d answering 101 forbids it; keep an
# existing one (Debian container images ship one), remove only the one we created.
POLICY=/usr/sbin/policy-rc.d
created_policy=0
remove_policy() {
    if [ "$created_policy" = 1 ]; then
        rm -f "$POLICY"
        created_policy=0
    fi
}

install_packages() {
    local -a missing
    mapfile -t missing < <(missing_packages | tr ' ' '\n')
    if [ "${#missing[@]}" = 0 ]; then
        return
    fi
    say "installing Debian packages: ${missing[*]}"
    if [ ! -e "$POLICY" ]; then
        printf '#!/bin/sh\n# temporary, from deploy/setup.sh\nexit 101\n' >"$POLICY"
        chmod 755 "$POLICY"
        created_policy=1
        trap remove_policy EXIT
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
    remove_policy
}

# ---------------------------------------------------------------- Python venv

install_hash() {
    # Whatever changes what `pip install -e` builds, plus the interpreter.
    shopt -s nullglob
    local files=(pyproject.toml requirements.lock setup.py hilbert_c/*.c hilbert_c/*.h hilbert_c/build_kernel.py
                 fence/client_package/pyproject.toml)
    shopt -u nullglob
    {
        "$VENV/bin/python" -c 'import sys; print(sys.version)'
        sha256sum -- "${files[@]}"
    } | sha256sum | cut -d' ' -f1
}

setup_venv() {
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
        die "$PYTHON is older than 3.11"
    if ! "$VENV/bin/python" -c '' 2>/dev/null; then
        say "creating $VENV"
        rm -rf "$VENV"
        "$PYTHON" -m venv "$VENV"
        "$VENV/bin/python" -m pip install -q --upgrade pip
    fi
    local want
    want="$(install_hash)"
    if [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
        return
    fi
    # every extra (dev, spark, demo), each package at its version in requirements.lock, and the
    # client package (fence/client_package: the tests and the benchmarks use it as a client would)
    say "pip install -c requirements.lock -e '.[dev,spark,demo]' -e fence/client_package (builds the C kernel)"
    "$VENV/bin/python" -m pip install -q -c requirements.lock -e '.[dev,spark,demo]' -e fence/client_package
    echo "$want" >"$STAMP"
}

# ---------------------------------------------------------------- the pages' JS libraries

# The API's pages use JS libraries from npm (fence/web/package.json, versions pinned by its
# package-lock.json), served by the API itself: no CDN. `npm ci` again only when the lock changed.
install_web() {
    local web="$REPO/fence/web" stamp="$REPO/fence/web/node_modules/.geofence-lock.sha256" want
    want="$(sha256sum "$web/package-lock.json" | cut -d' ' -f1)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return
    fi
    say "npm ci (the pages' JS libraries, fence/web)"
    (cd "$web" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    echo "$want" >"$stamp"
}

# ---------------------------------------------------------------- RabbitMQ plugins

enable_plugins() {
    local p need=0
    for p in "${PLUGINS[@]}"; do
        grep -qw "$p" "$ENABLED_PLUGINS" 2>/dev/null || need=1
    done
    if [ "$need" = 1 ]; then
        say "enabling RabbitMQ plugins: ${PLUGINS[*]}"
        # The Debian wrapper runs rabbitmq-plugins as root from /var/lib/rabbitmq (cookie).
        rabbitmq-plugins enable --offline "${PLUGINS[@]}" >/dev/null
        chown rabbitmq:rabbitmq "$ENABLED_PLUGINS"
    fi
}

# ---------------------------------------------------------------- main

install_packages
# Debian's prometheus unit would take port 9090 at boot with /etc/prometheus's config; the local
# stack runs its own (deploy/monitoring.py), so it is disabled where systemd runs.
if [ -d /run/systemd/system ] && systemctl is-enabled prometheus >/dev/null 2>&1; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
setup_venv
install_web
enable_plugins
"$VENV/bin/geofence" up

case "$mode" in
    none) exit 0 ;;
    demo) exec "$VENV/bin/geofence" demo ;;
esac

# test: all three run whatever happens; pytest last, so that its summary is the last line.
failed=()
"$VENV/bin/ruff" check . || failed+=(ruff)
"$VENV/bin/mypy" || failed+=(mypy)
if [ "${#failed[@]}" != 0 ]; then
    say "failed: ${failed[*]} (pytest runs all the same)"
fi
rc=0
# the unit tests (no services, no shared state) on two workers, then the rest in order
"$VENV/bin/python" -m pytest -n 2 tests/unit || rc=$?
"$VENV/bin/python" -m pytest --ignore=tests/unit || rc=$?
if [ "${#failed[@]}" != 0 ] && [ "$rc" = 0 ]; then
    rc=1
fi
exit "$rc"
