# shellcheck shell=bash
# Shared helpers for the ops/ scripts. Source it; do not execute it.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Provides: logging (log/info/warn/die/step), repository paths (REPO_ROOT, CLUSTER_DIR),
# package installation (ensure_packages), PostgreSQL discovery (pg_bin_dir), free TCP ports
# (free_port, free_ports), readiness polling (wait_http, wait_tcp), small process helpers
# (pid_alive, stop_pid, as_pg_user) and the cluster launcher (cluster_bin, cluster_launcher,
# with_cluster_lock).

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    echo "ops/lib.sh holds helpers for the other ops/ scripts; source it, do not run it" >&2
    exit 2
fi
if [[ -n "${_OPS_LIB_SOURCED:-}" ]]; then
    return 0
fi
_OPS_LIB_SOURCED=1

OPS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$OPS_DIR/.." && pwd)"
# Everything a local cluster leaves behind (env file, logs, pidfiles, private Redis data).
CLUSTER_DIR="${CLUSTER_DIR:-$REPO_ROOT/.cluster}"
export OPS_DIR REPO_ROOT CLUSTER_DIR

# ---------------------------------------------------------------------------------------------
# Logging. Everything goes to stderr so that stdout stays usable for data (env files, tables).
# ---------------------------------------------------------------------------------------------

if [[ -t 2 && -z "${NO_COLOR:-}" ]]; then
    _C_DIM=$'\e[2m' _C_RED=$'\e[31m' _C_YEL=$'\e[33m' _C_GRN=$'\e[32m' _C_BLD=$'\e[1m' _C_OFF=$'\e[0m'
else
    _C_DIM='' _C_RED='' _C_YEL='' _C_GRN='' _C_BLD='' _C_OFF=''
fi

_ops_prog="$(basename "${0:-ops}")"

log()  { printf '%s[%s %s]%s %s\n' "$_C_DIM" "$_ops_prog" "$(date +%H:%M:%S)" "$_C_OFF" "$*" >&2; }
info() { log "$*"; }
ok()   { printf '%s[%s %s]%s %s%s%s\n' "$_C_DIM" "$_ops_prog" "$(date +%H:%M:%S)" "$_C_OFF" "$_C_GRN" "$*" "$_C_OFF" >&2; }
warn() { printf '%s[%s %s]%s %swarning:%s %s\n' "$_C_DIM" "$_ops_prog" "$(date +%H:%M:%S)" "$_C_OFF" "$_C_YEL" "$_C_OFF" "$*" >&2; }
err()  { printf '%s[%s %s]%s %serror:%s %s\n' "$_C_DIM" "$_ops_prog" "$(date +%H:%M:%S)" "$_C_OFF" "$_C_RED" "$_C_OFF" "$*" >&2; }
die()  { err "$*"; exit 1; }
step() { printf '\n%s==> %s%s\n' "$_C_BLD" "$*" "$_C_OFF" >&2; }

# Runs a command quietly; on failure prints the captured output and returns its status.
quiet() {
    local out rc=0
    out="$(mktemp "${TMPDIR:-/tmp}/ops-quiet.XXXXXX")"
    "$@" >"$out" 2>&1 || rc=$?
    if ((rc != 0)); then
        err "command failed (exit $rc): $*"
        tail -n 40 "$out" >&2
    fi
    rm -f "$out"
    return "$rc"
}

is_root() { [[ "$(id -u)" -eq 0 ]]; }

# as_pg_user CMD...: runs CMD as the database's OS user: `postgres` when root (from /, which it
# can read), else as ourselves.
as_pg_user() {
    if is_root; then
        (cd / && runuser -u postgres -- "$@")
    else
        "$@"
    fi
}

# ---------------------------------------------------------------------------------------------
# Packages
# ---------------------------------------------------------------------------------------------

# pg_bin_dir: prints the PostgreSQL server bin directory (the one holding initdb, postgres,
# pg_ctl, psql, pg_isready). $ALLOCATOR_PG_BIN wins (same knob as the Rust test harness), else the
# highest /usr/lib/postgresql/<version>/bin. Returns 1 when none is installed.
pg_bin_dir() {
    if [[ -n "${ALLOCATOR_PG_BIN:-}" ]]; then
        if [[ -x "$ALLOCATOR_PG_BIN/postgres" && -x "$ALLOCATOR_PG_BIN/initdb" ]]; then
            printf '%s\n' "$ALLOCATOR_PG_BIN"
            return 0
        fi
        err "ALLOCATOR_PG_BIN=$ALLOCATOR_PG_BIN does not contain postgres and initdb"
        return 1
    fi
    local dir best="" best_ver=-1 ver
    for dir in /usr/lib/postgresql/*/bin; do
        [[ -x "$dir/postgres" && -x "$dir/initdb" && -x "$dir/pg_ctl" ]] || continue
        ver="$(basename "$(dirname "$dir")")"
        ver="${ver%%.*}"
        [[ "$ver" =~ ^[0-9]+$ ]] || continue
        if ((ver > best_ver)); then
            best_ver=$ver
            best=$dir
        fi
    done
    [[ -n "$best" ]] || return 1
    printf '%s\n' "$best"
}

# first_found TEST [PATH...]: prints the first PATH that passes `test TEST` (-x: an executable,
# -f: a file); empty PATHs are skipped. Returns 1 when none does. Each lookup below passes its
# environment override first, so the override wins when it is usable.
first_found() {
    local test="$1" p
    shift
    for p in "$@"; do
        if [[ -n "$p" ]] && test "$test" "$p"; then
            printf '%s\n' "$p"
            return 0
        fi
    done
    return 1
}

# redis_server_bin: prints the redis-server executable ($ALLOCATOR_REDIS_SERVER, PATH,
# /usr/bin/redis-server). Returns 1 when absent.
redis_server_bin() {
    first_found -x "${ALLOCATOR_REDIS_SERVER:-}" "$(command -v redis-server 2>/dev/null)" \
        /usr/bin/redis-server
}

# libfaketime_path: the preload library that shifts a process's wall clock (clock-skew tests).
libfaketime_path() {
    first_found -f "${ALLOCATOR_LIBFAKETIME:-}" /usr/lib/*/faketime/libfaketime.so.1 \
        /usr/lib/faketime/libfaketime.so.1
}

_OPS_APT_UPDATED=""

# ensure_packages [what...]: installs the Debian packages behind the given capabilities when they
# are missing. Capabilities: postgresql (server binaries), redis (redis-server + redis-cli), curl,
# jq, python3, faketime, chromium (the headless browser and its WebDriver server, for the
# operations page's browser test), patroni, etcd (etcd-server and etcd-client: the Patroni
# tests' store), pgbouncer, pgbackrest. Without arguments: postgresql redis curl jq. Runs `apt-get update` at most once per
# shell and only when something must be installed. Set OPS_NO_INSTALL=1 to only check.
ensure_packages() {
    local want=("$@")
    ((${#want[@]})) || want=(postgresql redis curl jq)
    local missing=() cap
    for cap in "${want[@]}"; do
        case "$cap" in
            postgresql)
                # An explicit ALLOCATOR_PG_BIN that is wrong is a configuration error, not a
                # missing package.
                [[ -z "${ALLOCATOR_PG_BIN:-}" ]] || pg_bin_dir >/dev/null || die "fix or unset ALLOCATOR_PG_BIN"
                pg_bin_dir >/dev/null 2>&1 || missing+=(postgresql)
                ;;
            redis)
                if ! redis_server_bin >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
                    missing+=(redis-server)
                fi
                ;;
            curl) command -v curl >/dev/null 2>&1 || missing+=(curl) ;;
            jq) command -v jq >/dev/null 2>&1 || missing+=(jq) ;;
            python3) command -v python3 >/dev/null 2>&1 || missing+=(python3) ;;
            faketime) libfaketime_path >/dev/null 2>&1 || missing+=(faketime) ;;
            chromium)
                [[ -x /usr/bin/chromium ]] || missing+=(chromium)
                [[ -x /usr/bin/chromedriver ]] || missing+=(chromium-driver)
                ;;
            patroni) command -v patroni >/dev/null 2>&1 && command -v patronictl >/dev/null 2>&1 || missing+=(patroni) ;;
            etcd)
                command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
                command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
                ;;
            pgbouncer) command -v pgbouncer >/dev/null 2>&1 || [[ -x /usr/sbin/pgbouncer ]] || missing+=(pgbouncer) ;;
            pgbackrest) command -v pgbackrest >/dev/null 2>&1 || missing+=(pgbackrest) ;;
            *) die "ensure_packages: unknown capability '$cap'" ;;
        esac
    done
    ((${#missing[@]})) || return 0

    if [[ -n "${OPS_NO_INSTALL:-}" ]]; then
        die "missing packages: ${missing[*]} (OPS_NO_INSTALL is set; install them with apt-get)"
    fi
    local sudo=()
    if ! is_root; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            sudo=(sudo -n)
        else
            die "missing packages: ${missing[*]}; run: sudo apt-get install -y ${missing[*]}"
        fi
    fi
    command -v apt-get >/dev/null 2>&1 || die "missing packages: ${missing[*]} and no apt-get on this machine"

    info "installing missing packages: ${missing[*]}"
    local apt_opts=(-o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0 -qq)
    if [[ -z "$_OPS_APT_UPDATED" ]]; then
        quiet "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" update \
            || die "apt-get update failed"
        _OPS_APT_UPDATED=1
    fi
    quiet "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y \
        --no-install-recommends "${missing[@]}" </dev/null \
        || die "apt-get install ${missing[*]} failed"
    # The packages' own etcd, Patroni and PgBouncer services are not wanted: the tests and the
    # local cluster run private ones on free ports. Where systemd started them, stop them.
    if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
        local unit
        for unit in etcd patroni pgbouncer; do
            "${sudo[@]}" systemctl disable --now "$unit" >/dev/null 2>&1 || true
        done
    fi
    # Re-check: the package may not provide what we looked for (e.g. an unusual layout).
    for cap in "${want[@]}"; do
        case "$cap" in
            postgresql) pg_bin_dir >/dev/null 2>&1 || die "postgresql installed but no /usr/lib/postgresql/<v>/bin found" ;;
            redis) redis_server_bin >/dev/null 2>&1 || die "redis-server installed but not found" ;;
            faketime) libfaketime_path >/dev/null 2>&1 || die "faketime installed but libfaketime.so.1 not found" ;;
            chromium) [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]] || die "chromium installed but /usr/bin/chromium or /usr/bin/chromedriver missing" ;;
            pgbouncer) command -v pgbouncer >/dev/null 2>&1 || [[ -x /usr/sbin/pgbouncer ]] || die "pgbouncer installed but not found" ;;
            etcd) command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1 || die "etcd-server/etcd-client installed but etcd or etcdctl not on PATH" ;;
            *) command -v "$cap" >/dev/null 2>&1 || die "$cap installed but not on PATH" ;;
        esac
    done
    ok "installed: ${missing[*]}"
}

# ---------------------------------------------------------------------------------------------
# Ports and readiness
# ---------------------------------------------------------------------------------------------

# Ports handed out by this shell, so that several free_port calls never return the same port
# before the services that will bind them have started.
_OPS_PORTS_TAKEN=" "

# port_in_use PORT: true when something accepts TCP connections on 127.0.0.1:PORT.
port_in_use() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# free_port: prints a TCP port on 127.0.0.1 that nothing listens on right now (and that this shell
# has not handed out before). Uses the kernel's ephemeral allocation through python3 when
# available, else probes random ports in 20000-59999 with bash's /dev/tcp.
free_port() {
    local port attempt
    for attempt in $(seq 1 50); do
        port=""
        if command -v python3 >/dev/null 2>&1; then
            port="$(python3 -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()' 2>/dev/null)" || port=""
        fi
        if [[ -z "$port" ]]; then
            port=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
        fi
        [[ "$_OPS_PORTS_TAKEN" == *" $port "* ]] && continue
        port_in_use "$port" && continue
        _OPS_PORTS_TAKEN+="$port "
        printf '%s\n' "$port"
        return 0
    done
    err "free_port: no free port found after $attempt attempts"
    return 1
}

# http_status URL: prints the HTTP status code of a GET (000 when nothing answered).
http_status() {
    curl -s -o /dev/null -w '%{http_code}' --connect-timeout 1 --max-time 3 "$1" 2>/dev/null || true
}

# wait_http URL [TIMEOUT_SECONDS=60] [PID]: waits until GET URL returns 200. When PID is given and
# that process exits, gives up at once. Returns 1 on timeout or death.
wait_http() {
    local url=$1 timeout=${2:-60} pid=${3:-} code=000
    local deadline=$((SECONDS + timeout))
    while ((SECONDS < deadline)); do
        code="$(http_status "$url")"
        [[ "$code" == 200 ]] && return 0
        if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
            err "process $pid exited while waiting for $url"
            return 1
        fi
        sleep 0.3
    done
    err "timed out after ${timeout}s waiting for $url (last status $code)"
    return 1
}

# wait_tcp HOST PORT [TIMEOUT_SECONDS=30]: waits until HOST:PORT accepts connections.
wait_tcp() {
    local host=$1 port=$2 timeout=${3:-30}
    local deadline=$((SECONDS + timeout))
    while ((SECONDS < deadline)); do
        (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null && return 0
        sleep 0.2
    done
    return 1
}

# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------

# pid_alive PID [EXE]: true when PID runs (and, when EXE is given, runs that executable; guards
# against a recycled pid from a stale pidfile).
pid_alive() {
    local pid=$1 exe=${2:-} actual
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    # A zombie (exited, not yet reaped) counts as dead.
    if [[ -r "/proc/$pid/stat" ]]; then
        local stat
        stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || return 1
        stat="${stat##*) }"
        [[ "${stat%% *}" == Z ]] && return 1
    fi
    if [[ -n "$exe" && -e "/proc/$pid/exe" ]]; then
        actual="$(readlink "/proc/$pid/exe" 2>/dev/null)" || return 0
        actual="${actual% (deleted)}"
        [[ "$actual" == "$(readlink -f "$exe")" ]] || return 1
    fi
    return 0
}

# read_pidfile FILE: prints the pid stored in FILE (first line), or nothing.
read_pidfile() {
    [[ -r "$1" ]] || return 1
    local pid
    read -r pid <"$1" || true
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    printf '%s\n' "$pid"
}

# stop_pid PID NAME [TIMEOUT=30] [EXE]: SIGTERM, wait up to TIMEOUT seconds, then SIGKILL.
# Returns 0 once the process is gone (2 when it had to be killed).
stop_pid() {
    local pid=$1 name=$2 timeout=${3:-30} exe=${4:-}
    pid_alive "$pid" "$exe" || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    local deadline=$((SECONDS + timeout))
    while ((SECONDS < deadline)); do
        pid_alive "$pid" || return 0
        sleep 0.2
    done
    warn "$name (pid $pid) did not exit within ${timeout}s of SIGTERM; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.2
    return 2
}

# cluster_bin: prints the cluster launcher (testkit's `cluster` binary, which ops/cluster.sh and
# ops/services.sh wrap): $CLUSTER_BIN, else the one beside $CLUSTER_ALLOCATOR_BIN, else the
# release or debug build; builds a debug one when there is none.
cluster_bin() {
    local target="${CARGO_TARGET_DIR:-$REPO_ROOT/target}" bin
    for bin in "${CLUSTER_BIN:-}" "${CLUSTER_ALLOCATOR_BIN:+$(dirname "$CLUSTER_ALLOCATOR_BIN")/cluster}" \
        "$target/release/cluster" "$target/debug/cluster"; do
        [[ -n "$bin" && -x "$bin" ]] && { printf '%s\n' "$bin"; return 0; }
    done
    command -v cargo >/dev/null 2>&1 || { err "no cluster binary and no cargo to build it"; return 1; }
    info "building the cluster launcher (cargo build -p testkit --bin cluster)"
    (cd "$REPO_ROOT" && cargo build -q -p testkit --bin cluster </dev/null >&2) || return 1
    printf '%s\n' "$target/debug/cluster"
}

# cluster_launcher ARGS...: the cluster binary with ARGS (8>&-: it must not inherit the lock).
cluster_launcher() {
    local bin
    bin="$(cluster_bin)" || die "no cluster launcher binary"
    "$bin" "$@" 8>&-
}

# with_cluster_lock CMD...: runs CMD holding $CLUSTER_DIR/.cluster.lock, so that one `up` or
# `down` (of ops/cluster.sh or ops/services.sh) runs at a time per cluster directory.
with_cluster_lock() {
    mkdir -p "$CLUSTER_DIR"
    exec 8>"$CLUSTER_DIR/.cluster.lock"
    flock -w 600 8 || die "another up/down holds $CLUSTER_DIR/.cluster.lock"
    "$@"
}

# load_cluster_env: sources $CLUSTER_DIR/env when it exists (DATABASE_URL, REDIS_URL, ...).
load_cluster_env() {
    local f="$CLUSTER_DIR/env"
    [[ -r "$f" ]] || return 1
    # shellcheck disable=SC1090
    source "$f"
}

# print_header_usage FILE: prints FILE's leading comment block (after the shebang) as help text.
print_header_usage() {
    awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$1"
}

# only_help_flag FILE ARGS...: the arguments of a script (FILE) that takes none but -h/--help:
# prints its header and exits on --help, dies naming anything else.
only_help_flag() {
    local script=$1 arg
    shift
    for arg in "$@"; do
        case "$arg" in
            -h | --help) print_header_usage "$script"; exit 0 ;;
            *) die "unknown argument '$arg' (try --help)" ;;
        esac
    done
}

# The Prometheus package CI unpacks is pinned by version and digest, so a mirror update cannot
# change what CI runs; a mirror that no longer has this version fails loudly here (update both
# values together: `apt-cache show prometheus=VERSION | grep SHA256`).
PROMETHEUS_DEB_VERSION="${PROMETHEUS_DEB_VERSION:-2.42.0+ds-5+deb12u1}"
PROMETHEUS_DEB_SHA256="${PROMETHEUS_DEB_SHA256:-81d59a24fce84f7fbe97a45a4f2914b6a5881b5cd1db2a6a0e129e515e1a5f55}"

# _prometheus_deb_dir: prints a directory holding Debian's `prometheus` package
# ($PROMETHEUS_DEB_VERSION, checked against $PROMETHEUS_DEB_SHA256) unpacked (its usr/bin has
# both promtool and the prometheus server), downloading and unpacking it into a cache directory
# on first use. Nothing is installed and no service is started.
_prometheus_deb_dir() {
    local cache="${XDG_CACHE_HOME:-$HOME/.cache}/allocator-ops/prometheus-$PROMETHEUS_DEB_VERSION"
    if [[ ! -x "$cache/usr/bin/promtool" || ! -x "$cache/usr/bin/prometheus" ]]; then
        [[ -z "${OPS_NO_INSTALL:-}" ]] || { err "Prometheus tools missing and OPS_NO_INSTALL is set"; return 1; }
        command -v apt-get >/dev/null 2>&1 || { err "Prometheus tools missing and no apt-get to fetch them"; return 1; }
        local tmp want="prometheus=$PROMETHEUS_DEB_VERSION"
        tmp="$(mktemp -d)"
        if ! (cd "$tmp" && apt-get download "$want" >/dev/null 2>&1); then
            apt-get update -qq >/dev/null 2>&1 || true
            (cd "$tmp" && apt-get download "$want" >/dev/null 2>&1) || { rm -rf "$tmp"; err "could not download Debian's $want (pinned in ops/lib.sh)"; return 1; }
        fi
        local got
        got="$(sha256sum "$tmp"/prometheus_*.deb | cut -d' ' -f1)"
        [[ "$got" == "$PROMETHEUS_DEB_SHA256" ]] || { rm -rf "$tmp"; err "$want has SHA-256 $got, expected $PROMETHEUS_DEB_SHA256"; return 1; }
        mkdir -p "$cache"
        dpkg -x "$tmp"/prometheus_*.deb "$cache" || { rm -rf "$tmp"; return 1; }
        rm -rf "$tmp"
    fi
    echo "$cache"
}

# promtool_bin: prints a promtool binary. Uses one on PATH; otherwise unpacks Debian's
# `prometheus` package into a cache directory without installing (or starting) the server.
promtool_bin() {
    if command -v promtool >/dev/null 2>&1; then
        command -v promtool
        return 0
    fi
    local dir
    dir="$(_prometheus_deb_dir)" || return 1
    echo "$dir/usr/bin/promtool"
}

# prometheus_bin: prints a Prometheus server binary for the tests that scrape a real cluster
# ($ALLOCATOR_PROMETHEUS_BIN, PATH, else the unpacked Debian package above). Returns 1 when none
# can be had.
prometheus_bin() {
    first_found -x "${ALLOCATOR_PROMETHEUS_BIN:-}" "$(command -v prometheus 2>/dev/null)" &&
        return 0
    local dir
    dir="$(_prometheus_deb_dir)" || return 1
    echo "$dir/usr/bin/prometheus"
}

# Pinned validators for ops/deploy (installed from PyPI into a private virtualenv, never into
# the system Python). kubernetes-validate ships the Kubernetes JSON schemas it validates against,
# and check-jsonschema ships the compose-spec schema, so validation itself needs no network.
OPS_VALIDATORS_PIP=(kubernetes-validate==1.37.0 check-jsonschema==0.39.0)

# validators_venv: prints the bin directory of a virtualenv holding OPS_VALIDATORS_PIP, creating
# or updating it when the pinned list changed.
validators_venv() {
    local venv="${XDG_CACHE_HOME:-$HOME/.cache}/allocator-ops/validators-venv"
    local pinned="${OPS_VALIDATORS_PIP[*]}"
    if [[ -x "$venv/bin/kubernetes-validate" && -x "$venv/bin/check-jsonschema" \
        && "$(cat "$venv/.pinned" 2>/dev/null)" == "$pinned" ]]; then
        echo "$venv/bin"
        return 0
    fi
    [[ -z "${OPS_NO_INSTALL:-}" ]] || { err "validators missing and OPS_NO_INSTALL is set"; return 1; }
    ensure_packages python3
    if ! python3 -m venv --clear "$venv" >/dev/null 2>&1; then
        # Debian splits venv support out of python3.
        is_root && command -v apt-get >/dev/null 2>&1 \
            && quiet env DEBIAN_FRONTEND=noninteractive apt-get -qq install -y python3-venv </dev/null
        python3 -m venv --clear "$venv" >/dev/null 2>&1 || { err "python3 -m venv failed (install python3-venv)"; return 1; }
    fi
    quiet "$venv/bin/pip" install --quiet --disable-pip-version-check "${OPS_VALIDATORS_PIP[@]}" \
        || { err "pip install ${OPS_VALIDATORS_PIP[*]} failed"; return 1; }
    printf '%s\n' "$pinned" >"$venv/.pinned"
    echo "$venv/bin"
}
