#!/usr/bin/env bash
# A local allocator cluster: PostgreSQL, Redis, N allocators, M routers, started and supervised by
# the cluster launcher (testkit's `cluster` binary, testkit::Cluster); this script installs
# packages, builds and runs it.
#
#   ops/cluster.sh up       build, provide PostgreSQL and Redis, migrate, start allocators and
#                           routers, wait until ready and every partition has an owner, print URLs
#                           and the ownership map; everything keeps running in the background.
#                           Flags after `up` go to the launcher (`cluster up --help`), e.g.
#   ops/cluster.sh up --ha patroni   PostgreSQL under Patroni: three etcd members and
#                           CLUSTER_HA_NODES (3) nodes in synchronous mode with pg_rewind, on free
#                           ports; services get the multi-host URL of every node, and
#                           .cluster/cluster.env sets PATRONICTL_CONFIG_FILE for `patronictl list`
#   ops/cluster.sh demo     walk through the API via a router with the client crate's example
#                           (restock, reserve, replay, out-of-stock, confirm, release, multi-line
#                           orders); exits 1 when an answer differs from what the contract says
#   ops/cluster.sh status   processes, services and the ownership map
#   ops/cluster.sh map      only the ownership map
#   ops/cluster.sh down     SIGTERM routers and allocators (allocators release their leases),
#                           wait, then stop the servers this cluster started
#
# Knobs (environment): CLUSTER_PARTITIONS (16), CLUSTER_ALLOCATORS (3), CLUSTER_ROUTERS (2),
# CLUSTER_PRIVATE=1 (private PostgreSQL and Redis even when system ones run; CLUSTER_PRIVATE_PG,
# CLUSTER_PRIVATE_REDIS for one), CLUSTER_PG_STANDBY=sync|async (with CLUSTER_PRIVATE=1: a
# streaming standby, and every service gets the multi-host URL of both servers),
# CLUSTER_HA=patroni (as --ha patroni) with CLUSTER_HA_NODES, CLUSTER_PG_DURABLE=1, CLUSTER_PG_OPTIONS, CLUSTER_DB_NAME (allocator_demo),
# CLUSTER_DATABASE_URL (serve from an existing database as it is, e.g. a restored copy; nothing
# dropped, only missing migrations applied),
# CLUSTER_SYSTEM_PG_HOST / CLUSTER_SYSTEM_PG_PORT / CLUSTER_SYSTEM_PG_USER,
# CLUSTER_SYSTEM_REDIS_HOST / CLUSTER_SYSTEM_REDIS_PORT, CLUSTER_SKIP_BUILD=1,
# CLUSTER_READY_TIMEOUT (90 s), CLUSTER_MAP_TIMEOUT (60 s), CLUSTER_STOP_TIMEOUT (30 s),
# CLUSTER_ALLOCATOR_ARGS / CLUSTER_ROUTER_ARGS (extra flags), CLUSTER_ALLOCATOR_BIN /
# CLUSTER_ROUTER_BIN (other binaries), CLUSTER_BIN (the launcher), RUST_LOG (default info),
# CLUSTER_DIR (.cluster), CLUSTER_TOKEN (a bearer token sent by `map`, `status` and `demo`,
# needed when the routers run with --auth-file; `AUTH=1 ops/run-local.sh` sets it). Every knob is
# also a flag of `cluster up --help`.
# Files: .cluster/env, .cluster/cluster.env (DATABASE_URL REDIS_URL ROUTER_URL ROUTER_URLS
# ALLOCATOR_URLS, to source), .cluster/logs/*.log, .cluster/run/*.{pid,url}; see ops/README.md.
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
export CLUSTER_ALLOCATOR_BIN="${CLUSTER_ALLOCATOR_BIN:-$TARGET_DIR/release/allocator}"
export CLUSTER_ROUTER_BIN="${CLUSTER_ROUTER_BIN:-$TARGET_DIR/release/router}"

build() {
    if [[ -n "${CLUSTER_SKIP_BUILD:-}" ]]; then
        info "CLUSTER_SKIP_BUILD set: not building"
    else
        command -v cargo >/dev/null 2>&1 || die "cargo not found (install Rust via rustup)"
        step "cargo build --release -p allocator -p router -p testkit"
        (cd "$REPO_ROOT" && cargo build --release -p allocator -p router -p testkit </dev/null) \
            || die "cargo build failed"
        export CLUSTER_BIN="${CLUSTER_BIN:-$TARGET_DIR/release/cluster}"
    fi
    [[ -x "$CLUSTER_ALLOCATOR_BIN" ]] || die "allocator binary not found at $CLUSTER_ALLOCATOR_BIN"
    [[ -x "$CLUSTER_ROUTER_BIN" ]] || die "router binary not found at $CLUSTER_ROUTER_BIN"
}

cmd_up() {
    step "packages"
    ensure_packages postgresql redis curl jq
    local arg ha="${CLUSTER_HA:-}"
    for arg in "$@"; do
        [[ "$arg" == patroni || "$arg" == --ha=patroni ]] && ha=patroni
    done
    [[ "$ha" == patroni ]] && ensure_packages patroni etcd
    build
    step "cluster up ($CLUSTER_DIR)"
    cluster_launcher up "$@"
    echo "  ops/cluster.sh demo | status | down"
}

# The API's contract walked through against a ready router by the client crate's example
# (allocator/client/examples/walkthrough.rs): restock, reserve, replay, out of stock, confirm,
# release, orders; it exits non-zero when an answer differs. CLUSTER_TOKEN is its bearer token.
cmd_demo() {
    local url="${CLUSTER_DEMO_URL:-}" candidate
    if [[ -z "$url" && -r "$CLUSTER_DIR/cluster.env" ]]; then
        # shellcheck disable=SC1091
        for candidate in $(source "$CLUSTER_DIR/cluster.env" && echo "${ROUTER_URLS:-}"); do
            [[ "$(http_status "$candidate/readyz")" == 200 ]] && { url=$candidate; break; }
        done
    fi
    [[ -n "$url" ]] || die "no ready router; run ops/cluster.sh up first (or set CLUSTER_DEMO_URL)"
    command -v cargo >/dev/null 2>&1 || die "cargo not found (install Rust via rustup)"
    (cd "$REPO_ROOT" && cargo run --release --quiet -p allocator-client --example walkthrough \
        -- "$url" </dev/null) || { err "demo: an answer differed from the contract (see '!!' above)"; return 1; }
    ok "demo: every answer as specified"
}

cmd_down() {
    if [[ ! -e "$CLUSTER_DIR/run/cluster.pid" ]]; then
        info "no cluster recorded in $CLUSTER_DIR"
        return 0
    fi
    cluster_launcher down
}

usage() { print_header_usage "${BASH_SOURCE[0]}"; }

case "${1:-}" in
    up) shift; with_cluster_lock cmd_up "$@" ;;
    down) with_cluster_lock cmd_down ;;
    demo) cmd_demo ;;
    status) cluster_launcher status ;;
    map) cluster_launcher map ;;
    -h | --help | help) usage ;;
    *) usage >&2; exit 2 ;;
esac
