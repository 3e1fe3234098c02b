#!/usr/bin/env bash
# A local allocator cluster: PostgreSQL + Redis (ops/services.sh), N allocators, M routers.
#
#   ops/cluster.sh up       build, provide services, migrate, start allocators and routers, wait
#                           until ready, print URLs and the partition ownership map
#   ops/cluster.sh demo     walk through the API via a router with the client crate's example
#                           (restock, reserve, replay, out-of-stock, confirm, release, multi-line
#                           orders); exits 1 when an answer differs from what the contract says
#   ops/cluster.sh status   processes, services and the ownership map
#   ops/cluster.sh map      only the ownership map
#   ops/cluster.sh down     SIGTERM routers and allocators (allocators release their leases),
#                           wait, then stop the services this cluster started
#
# Knobs (environment): CLUSTER_PARTITIONS (16), CLUSTER_ALLOCATORS (3), CLUSTER_ROUTERS (2),
# CLUSTER_PRIVATE=1 (private PostgreSQL and Redis even when system ones run), CLUSTER_PG_STANDBY=
# sync|async (with CLUSTER_PRIVATE=1: a streaming standby, and every service gets the multi-host
# URL of both servers), CLUSTER_SKIP_BUILD=1,
# CLUSTER_READY_TIMEOUT (90 s), CLUSTER_MAP_TIMEOUT (60 s), CLUSTER_STOP_TIMEOUT (30 s),
# CLUSTER_ALLOCATOR_ARGS / CLUSTER_ROUTER_ARGS (extra flags), CLUSTER_ALLOCATOR_BIN /
# CLUSTER_ROUTER_BIN (other binaries), RUST_LOG (default info), CLUSTER_DIR (.cluster),
# CLUSTER_TOKEN (a bearer token sent by `map`, `status` and `demo`, needed when the routers run
# with --auth-file; `AUTH=1 ops/run-local.sh` sets it).
# Files: .cluster/{env,cluster.env} .cluster/logs/*.log .cluster/run/*.{pid,url}; see ops/README.md.
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PARTITIONS="${CLUSTER_PARTITIONS:-16}"
N_ALLOC="${CLUSTER_ALLOCATORS:-3}"
N_ROUTER="${CLUSTER_ROUTERS:-2}"
READY_TIMEOUT="${CLUSTER_READY_TIMEOUT:-90}"
MAP_TIMEOUT="${CLUSTER_MAP_TIMEOUT:-60}"
STOP_TIMEOUT="${CLUSTER_STOP_TIMEOUT:-30}"
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
ALLOC_BIN="${CLUSTER_ALLOCATOR_BIN:-$TARGET_DIR/release/allocator}"
ROUTER_BIN="${CLUSTER_ROUTER_BIN:-$TARGET_DIR/release/router}"
RUN_DIR="$CLUSTER_DIR/run"
LOG_DIR="$CLUSTER_DIR/logs"
CLUSTER_ENV="$CLUSTER_DIR/cluster.env"

for v in PARTITIONS N_ALLOC N_ROUTER READY_TIMEOUT MAP_TIMEOUT STOP_TIMEOUT; do
    [[ "${!v}" =~ ^[0-9]+$ ]] || die "$v must be a non-negative integer, got '${!v}'"
done
((PARTITIONS >= 1)) || die "CLUSTER_PARTITIONS must be at least 1"
((N_ALLOC >= 1)) || die "CLUSTER_ALLOCATORS must be at least 1"

# --- process bookkeeping -----------------------------------------------------------------------

# start_proc NAME URL BIN ARGS...: starts BIN detached (own session, stdin closed, output to
# .cluster/logs/NAME.log) and records pid + executable in run/NAME.pid and the URL in run/NAME.url.
start_proc() {
    local name=$1 url=$2 bin=$3 pid
    shift 3
    local log="$LOG_DIR/$name.log"
    printf '=== %s: %s %s\n' "$(date -Is)" "$bin" "$*" >>"$log"
    # setsid: Ctrl-C in the terminal that ran `up` does not reach the cluster. 8>&- 9>&-: do not
    # inherit the ops/ lock files.
    RUST_LOG="${RUST_LOG:-info}" setsid "$bin" "$@" >>"$log" 2>&1 </dev/null 8>&- 9>&- &
    pid=$!
    # Record the executable's path too: a stale pidfile must never make us signal a recycled pid
    # (checked against /proc/PID/cmdline by proc_pid).
    printf '%s\n%s\n' "$pid" "$bin" >"$RUN_DIR/$name.pid"
    printf '%s\n' "$url" >"$RUN_DIR/$name.url"
}

# proc_pid NAME: prints the pid of a running cluster process NAME: the pidfile's pid is alive
# and runs the recorded binary (argv[0], or argv[1] for a script run through an interpreter).
proc_pid() {
    local f="$RUN_DIR/$1.pid" pid bin=""
    [[ -r "$f" ]] || return 1
    { read -r pid; read -r bin || true; } <"$f"
    pid_alive "$pid" || return 1
    if [[ -n "$bin" && -r "/proc/$pid/cmdline" ]]; then
        # Until the forked shell has exec'ed setsid and setsid the binary, argv differs; allow it
        # a moment.
        local _try
        for _try in 1 2 3 4 5 6 7 8 9 10; do
            tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -n 2 | grep -Fxq -- "$bin" && break
            [[ $_try == 10 ]] && return 1
            sleep 0.05
        done
    fi
    printf '%s\n' "$pid"
}

proc_url() { cat "$RUN_DIR/$1.url" 2>/dev/null; }

# Names of recorded processes of a kind (alloc|router), in numeric order.
proc_names() {
    local kind=$1 f
    for f in "$RUN_DIR/$kind"-*.pid; do
        [[ -e "$f" ]] || continue
        basename "$f" .pid
    done | sort -t- -k2,2n
}

log_tail() {
    local name=$1
    err "last lines of $LOG_DIR/$name.log:"
    tail -n "${2:-25}" "$LOG_DIR/$name.log" 2>/dev/null | sed 's/^/    /' >&2 || true
}

# stop_kind KIND: SIGTERM every process of that kind at once, then wait for all of them.
stop_kind() {
    local kind=$1 name pid names=() pids=()
    for name in $(proc_names "$kind"); do
        if pid="$(proc_pid "$name")"; then
            kill -TERM "$pid" 2>/dev/null || true
            names+=("$name")
            pids+=("$pid")
        fi
    done
    local i rc
    for i in "${!pids[@]}"; do
        rc=0
        stop_pid "${pids[$i]}" "${names[$i]}" "$STOP_TIMEOUT" || rc=$?
        if ((rc == 2)); then
            warn "${names[$i]} had to be killed (leases expire by TTL instead of being released)"
        else
            info "stopped ${names[$i]} (pid ${pids[$i]})"
        fi
    done
    for name in $(proc_names "$kind"); do
        rm -f "$RUN_DIR/$name.pid" "$RUN_DIR/$name.url"
    done
}

any_running() {
    local name
    for name in $(proc_names alloc) $(proc_names router); do
        proc_pid "$name" >/dev/null && return 0
    done
    return 1
}

# --- ownership map -------------------------------------------------------------------------------

# first_ready_url: a router (else an allocator) that answers /readyz.
first_ready_url() {
    local name url
    for name in $(proc_names router) $(proc_names alloc); do
        url="$(proc_url "$name")" || continue
        [[ "$(http_status "$url/readyz")" == 200 ]] && { printf '%s\n' "$url"; return 0; }
    done
    return 1
}

# The optional bearer token as curl arguments (empty without CLUSTER_TOKEN).
auth_args() { [[ -n "${CLUSTER_TOKEN:-}" ]] && printf '%s\n' -H "authorization: Bearer $CLUSTER_TOKEN"; return 0; }

fetch_map() {
    local auth=()
    mapfile -t auth < <(auth_args)
    curl -sf --max-time 5 "${auth[@]}" "$1/v1/partitions"
}

# print_map JSON: compact table, four partitions per row, then partitions per owner.
print_map() {
    local json=$1
    jq -r '"partition_count \(.partition_count)  revision \(.revision)  unowned \([.partitions[] | select(.owner_id == null)] | length)"' <<<"$json"
    jq -r '.partitions | sort_by(.partition)[] |
        [ (.partition | tostring), (.owner_id // "-"), (.epoch | tostring),
          (if .lease_remaining_ms == null then "-" else ((.lease_remaining_ms / 1000 | floor | tostring) + "s") end)
        ] | @tsv' <<<"$json" |
        awk -F'\t' 'BEGIN { hdr = sprintf("%4s %-10s %5s %6s", "part", "owner", "epoch", "lease") }
            { cell[n++] = sprintf("%4s %-10s %5s %6s", $1, $2, $3, $4) }
            END {
                cols = 4; if (n < cols) cols = n
                line = ""; for (c = 0; c < cols; c++) line = line (c ? " | " : "") hdr; print line
                for (i = 0; i < n; i += cols) {
                    line = ""; for (c = 0; c < cols && i + c < n; c++) line = line (c ? " | " : "") cell[i + c]; print line
                }
            }'
    jq -r '[.partitions[] | {o: (.owner_id // "(none)"), p: .partition}] | group_by(.o)[] |
        "  \(.[0].o): \(length) partitions [\(map(.p | tostring) | join(","))]"' <<<"$json"
}

# wait_map_complete URL TIMEOUT: until every partition has an owner. Prints the final map JSON.
wait_map_complete() {
    local url=$1 timeout=$2 json="" unowned
    local deadline=$((SECONDS + timeout))
    while ((SECONDS < deadline)); do
        if json="$(fetch_map "$url")"; then
            unowned="$(jq '[.partitions[] | select(.owner_id == null)] | length' <<<"$json" 2>/dev/null)" || unowned=x
            if [[ "$unowned" == 0 ]] && [[ "$(jq '.partitions | length' <<<"$json")" -ge "$PARTITIONS" ]]; then
                printf '%s\n' "$json"
                return 0
            fi
        fi
        sleep 0.5
    done
    [[ -n "$json" ]] && printf '%s\n' "$json"
    return 1
}

# --- commands ----------------------------------------------------------------------------------

build() {
    if [[ -n "${CLUSTER_SKIP_BUILD:-}" ]]; then
        info "CLUSTER_SKIP_BUILD set: not building"
    else
        command -v cargo >/dev/null 2>&1 || die "cargo not found (install Rust via rustup)"
        step "cargo build --release -p allocator -p router"
        (cd "$REPO_ROOT" && cargo build --release -p allocator -p router </dev/null) \
            || die "cargo build failed"
    fi
    [[ -x "$ALLOC_BIN" ]] || die "allocator binary not found at $ALLOC_BIN"
    [[ -x "$ROUTER_BIN" ]] || die "router binary not found at $ROUTER_BIN"
}

cmd_up() {
    step "packages"
    ensure_packages postgresql redis curl jq
    build
    mkdir -p "$RUN_DIR" "$LOG_DIR"
    if any_running; then
        info "a cluster from an earlier 'up' is running; stopping it first"
        stop_kind router
        stop_kind alloc
    fi
    rm -f "$RUN_DIR"/*.pid "$RUN_DIR"/*.url "$CLUSTER_ENV"
    # Fresh logs per `up`; the previous run's are kept as *.log.1.
    local f
    for f in "$LOG_DIR"/*.log; do
        [[ -e "$f" ]] && mv -f "$f" "$f.1"
    done

    step "PostgreSQL and Redis"
    "$OPS_DIR/services.sh" up 8>&-
    load_cluster_env || die "services.sh up did not write $CLUSTER_DIR/env"

    step "migrate ($PARTITIONS partitions)"
    if ! "$ALLOC_BIN" migrate --database-url "$DATABASE_URL" --partitions "$PARTITIONS" \
        >>"$LOG_DIR/migrate.log" 2>&1 </dev/null; then
        log_tail migrate
        die "allocator migrate failed"
    fi
    ok "schema migrated (log $LOG_DIR/migrate.log)"

    step "starting $N_ALLOC allocators and $N_ROUTER routers"
    local i port url extra=()
    # shellcheck disable=SC2206 # deliberate word splitting of the extra-args knobs
    extra=(${CLUSTER_ALLOCATOR_ARGS:-})
    for ((i = 1; i <= N_ALLOC; i++)); do
        port="$(free_port)"
        url="http://127.0.0.1:$port"
        start_proc "alloc-$i" "$url" "$ALLOC_BIN" serve \
            --database-url "$DATABASE_URL" --redis-url "$REDIS_URL" \
            --listen "127.0.0.1:$port" --replica-id "alloc-$i" --advertise-url "$url" "${extra[@]}"
    done
    # shellcheck disable=SC2206
    extra=(${CLUSTER_ROUTER_ARGS:-})
    for ((i = 1; i <= N_ROUTER; i++)); do
        port="$(free_port)"
        url="http://127.0.0.1:$port"
        start_proc "router-$i" "$url" "$ROUTER_BIN" serve \
            --database-url "$DATABASE_URL" --redis-url "$REDIS_URL" \
            --listen "127.0.0.1:$port" "${extra[@]}"
    done

    local name pid failed=()
    for name in $(proc_names alloc) $(proc_names router); do
        url="$(proc_url "$name")"
        pid="$(head -n1 "$RUN_DIR/$name.pid")"
        if wait_http "$url/readyz" "$READY_TIMEOUT" "$pid"; then
            ok "$name ready at $url (pid $pid)"
        else
            log_tail "$name"
            failed+=("$name")
        fi
    done
    if ((${#failed[@]})); then
        err "not ready: ${failed[*]}; stopping the cluster processes (logs stay in $LOG_DIR)"
        stop_kind router
        stop_kind alloc
        die "cluster up failed; 'ops/cluster.sh down' also stops the services"
    fi

    write_cluster_env

    step "ownership map"
    local map_url json
    map_url="$(first_ready_url)" || die "nothing answers /readyz any more"
    if json="$(wait_map_complete "$map_url" "$MAP_TIMEOUT")"; then
        print_map "$json"
    else
        [[ -n "$json" ]] && print_map "$json"
        warn "not every partition had an owner after ${MAP_TIMEOUT}s (see $LOG_DIR/alloc-*.log)"
    fi
    print_summary
}

write_cluster_env() {
    local name urls=() aurls=()
    for name in $(proc_names router); do urls+=("$(proc_url "$name")"); done
    for name in $(proc_names alloc); do aurls+=("$(proc_url "$name")"); done
    {
        echo "# written by ops/cluster.sh up at $(date -Is)"
        printf 'export DATABASE_URL=%q\n' "$DATABASE_URL"
        printf 'export REDIS_URL=%q\n' "$REDIS_URL"
        printf 'export ROUTER_URL=%q\n' "${urls[0]:-}"
        printf 'export ROUTER_URLS=%q\n' "${urls[*]:-}"
        printf 'export ALLOCATOR_URLS=%q\n' "${aurls[*]}"
    } >"$CLUSTER_ENV"
    # Prometheus file_sd targets (see ops/prometheus/prometheus.yml).
    mkdir -p "$CLUSTER_DIR/prometheus"
    local kind
    for kind in alloc router; do
        for name in $(proc_names "$kind"); do
            printf '{"targets":["%s"],"labels":{"replica":"%s"}}\n' "$(proc_url "$name" | sed 's|^http://||')" "$name"
        done | jq -s . >"$CLUSTER_DIR/prometheus/$([[ $kind == alloc ]] && echo allocator || echo router).json"
    done
}

print_summary() {
    local name
    echo
    echo "cluster is up:"
    for name in $(proc_names alloc) $(proc_names router); do
        printf '  %-9s %-24s pid %-7s log %s\n' "$name" "$(proc_url "$name")" \
            "$(proc_pid "$name" || echo '-')" "${LOG_DIR#"$REPO_ROOT"/}/$name.log"
    done
    printf '  %-9s %s\n' postgres "$DATABASE_URL" redis "$REDIS_URL"
    echo
    echo "  source ${CLUSTER_ENV#"$REPO_ROOT"/}   # DATABASE_URL REDIS_URL ROUTER_URL ROUTER_URLS ALLOCATOR_URLS"
    echo "  ops/cluster.sh demo | status | down"
}

# --- demo ----------------------------------------------------------------------------------------

# The API's contract walked through against a ready router by the client crate's example
# (allocator/client/examples/walkthrough.rs): restock, replay, reserve, out of stock, confirm,
# release, orders; it exits non-zero when an answer differs. CLUSTER_TOKEN is its bearer token.
cmd_demo() {
    DEMO_URL="${CLUSTER_DEMO_URL:-}"
    if [[ -z "$DEMO_URL" ]]; then
        local name
        for name in $(proc_names router); do
            DEMO_URL="$(proc_url "$name")"
            [[ "$(http_status "$DEMO_URL/readyz")" == 200 ]] && break
            DEMO_URL=""
        done
    fi
    [[ -n "$DEMO_URL" ]] || die "no ready router; run ops/cluster.sh up first (or set CLUSTER_DEMO_URL)"
    command -v cargo >/dev/null 2>&1 || die "cargo not found (install Rust via rustup)"
    (cd "$REPO_ROOT" && cargo run --release --quiet -p allocator-client --example walkthrough \
        -- "$DEMO_URL" </dev/null) || { err "demo: an answer differed from the contract (see '!!' above)"; return 1; }
    ok "demo: every answer as specified"
}

cmd_map() {
    local url json
    url="$(first_ready_url)" || die "no router or allocator answers /readyz"
    json="$(fetch_map "$url")" || die "GET $url/v1/partitions failed"
    print_map "$json"
}

cmd_status() {
    local name pid url code rc=0
    printf '%-9s %-7s %-24s %s\n' name pid url readyz
    for name in $(proc_names alloc) $(proc_names router); do
        url="$(proc_url "$name")"
        if pid="$(proc_pid "$name")"; then
            code="$(http_status "$url/readyz")"
        else
            pid=dead code=-
            rc=1
        fi
        printf '%-9s %-7s %-24s %s\n' "$name" "$pid" "$url" "$code"
    done
    [[ -z "$(proc_names alloc)" ]] && { echo "(no cluster processes recorded; run ops/cluster.sh up)"; rc=1; }
    echo
    "$OPS_DIR/services.sh" status || rc=1
    echo
    if url="$(first_ready_url)"; then
        cmd_map || rc=1
    else
        echo "ownership map: nothing answers /readyz"
        rc=1
    fi
    return "$rc"
}

cmd_down() {
    mkdir -p "$RUN_DIR"
    step "stopping routers"
    stop_kind router
    step "stopping allocators (they release their leases)"
    stop_kind alloc
    step "stopping services"
    "$OPS_DIR/services.sh" down 8>&-
    rm -f "$CLUSTER_ENV"
    ok "cluster down (logs kept in $LOG_DIR)"
}

with_lock() {
    mkdir -p "$CLUSTER_DIR"
    exec 8>"$CLUSTER_DIR/.cluster.lock"
    flock -w 600 8 || die "another ops/cluster.sh up/down holds $CLUSTER_DIR/.cluster.lock"
    "$@"
}

usage() { print_header_usage "${BASH_SOURCE[0]}"; }

case "${1:-}" in
    up) with_lock cmd_up ;;
    down) with_lock cmd_down ;;
    demo) cmd_demo ;;
    status) cmd_status ;;
    map) cmd_map ;;
    -h | --help | help) usage ;;
    *) usage >&2; exit 2 ;;
esac
