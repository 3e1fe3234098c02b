#!/usr/bin/env bash
# A local allocator cluster: PostgreSQL + Redis (ops/services.sh), N allocators, M routers.
#
#   ops/cluster.sh up       build, provide services, migrate, start allocators and routers, wait
#                           until ready, print URLs and the partition ownership map
#   ops/cluster.sh demo     walk through the API via a router (restock, reserve, replay,
#                           out-of-stock, confirm, release, multi-line order); exits 1 when an
#                           answer differs from what the contract says
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

DEMO_FAILS=0

# req METHOD PATH BODY EXPECT: one request to the router, printed compactly. EXPECT is a status
# (201), a class (2xx) or a list (200|201). Retries 503 and connection errors a few times with the
# same body (every request here is idempotent). Sets RESP_CODE, RESP_BODY, RESP_HEADERS.
req() {
    local method=$1 path=$2 body=$3 expect=$4 attempt hdr bodyf
    hdr="$(mktemp)" bodyf="$(mktemp)"
    printf '%s %s' "$method" "$path"
    [[ -n "$body" ]] && printf '  %s' "$body"
    printf '\n'
    local args=(-sS -X "$method" -D "$hdr" -o "$bodyf" -w '%{http_code}' --max-time 15)
    [[ -n "$body" ]] && args+=(-H 'content-type: application/json' --data "$body")
    local auth=()
    mapfile -t auth < <(auth_args)
    args+=("${auth[@]}")
    for attempt in 1 2 3 4 5 6 7 8 9 10; do
        RESP_CODE="$(curl "${args[@]}" "$DEMO_URL$path" 2>/dev/null)" || true
        [[ "$RESP_CODE" =~ ^(000|503)$ ]] || break
        printf '  .. %s, retrying with the same request (%d)\n' "$RESP_CODE" "$attempt"
        sleep 1
    done
    RESP_HEADERS="$(tr -d '\r' <"$hdr")"
    RESP_BODY="$(jq -c . <"$bodyf" 2>/dev/null || cat "$bodyf")"
    rm -f "$hdr" "$bodyf"
    local shown="" h
    for h in idempotent-replayed retry-after content-type; do
        local v
        v="$(grep -i "^$h:" <<<"$RESP_HEADERS" | tail -n1 | cut -d: -f2- | sed 's/^ *//')" || true
        [[ "$h" == content-type && "$v" != *problem* ]] && continue
        [[ -n "$v" ]] && shown+="  [$h: $v]"
    done
    local verdict=ok
    if ! [[ "$RESP_CODE" =~ ^(${expect//x/[0-9]})$ ]]; then
        verdict="UNEXPECTED (wanted $expect)"
        DEMO_FAILS=$((DEMO_FAILS + 1))
    fi
    printf '  -> %s%s  %s\n' "$RESP_CODE" "$shown" "$RESP_BODY"
    [[ "$verdict" == ok ]] || printf '  !! %s\n' "$verdict"
}

expect_header() { # name value
    if ! grep -qi "^$1: *$2" <<<"$RESP_HEADERS"; then
        printf '  !! expected header %s: %s\n' "$1" "$2"
        DEMO_FAILS=$((DEMO_FAILS + 1))
    fi
}

expect_json() { # jq-filter description
    if ! jq -e "$1" <<<"$RESP_BODY" >/dev/null 2>&1; then
        printf '  !! expected %s (jq: %s)\n' "$2" "$1"
        DEMO_FAILS=$((DEMO_FAILS + 1))
    fi
}

note() { printf '\n# %s\n' "$*"; }

cmd_demo() {
    command -v jq >/dev/null 2>&1 || die "jq is required for the demo (apt-get install -y jq)"
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
    local run r1 r2 r3 avail
    run="demo-$(date +%H%M%S)-$$"
    r1="$run-r1" r2="$run-r2" r3="$run-r3"
    echo "demo against router $DEMO_URL (ids prefixed $run)"

    note "restock: the first adjustment creates the SKU"
    req POST /v1/inventory/demo-widget/adjustments "{\"adjustment_id\":\"$run-a1\",\"delta\":3}" 2xx
    req POST /v1/inventory/demo-gadget/adjustments "{\"adjustment_id\":\"$run-a2\",\"delta\":10}" 2xx
    req POST /v1/inventory/demo-gizmo/adjustments "{\"adjustment_id\":\"$run-a3\",\"delta\":5}" 2xx
    note "an adjustment retried with the same id is applied once"
    req POST /v1/inventory/demo-widget/adjustments "{\"adjustment_id\":\"$run-a1\",\"delta\":3}" 2xx
    req GET /v1/inventory/demo-widget "" 200
    avail="$(jq -r '.available // empty' <<<"$RESP_BODY")"
    [[ "$avail" =~ ^[0-9]+$ ]] || avail=3

    note "reserve 2 of demo-widget"
    req POST /v1/reservations "{\"reservation_id\":\"$r1\",\"sku\":\"demo-widget\",\"quantity\":2}" 201
    expect_json '.status == "held"' 'status held'
    note "client retry with the same reservation id: original outcome, replayed"
    req POST /v1/reservations "{\"reservation_id\":\"$r1\",\"sku\":\"demo-widget\",\"quantity\":2}" 200
    expect_header Idempotent-Replayed true
    note "ask for more than is left: 409 insufficient-stock (nothing is held)"
    req POST /v1/reservations "{\"reservation_id\":\"$r2\",\"sku\":\"demo-widget\",\"quantity\":$((avail - 2 + 1))}" 409
    expect_json '.type | test("insufficient-stock")' 'problem type insufficient-stock'
    note "reserve the last one"
    req POST /v1/reservations "{\"reservation_id\":\"$r3\",\"sku\":\"demo-widget\",\"quantity\":1,\"ttl_seconds\":600}" 201

    note "confirm the first, release the other"
    req POST "/v1/reservations/$r1/confirm" "" 200
    req POST "/v1/reservations/$r3/release" "" 200
    note "a release after confirm is refused (invalid-state)"
    req POST "/v1/reservations/$r1/release" "" 409
    req GET "/v1/reservations/$r1" "" 200
    expect_json '.status == "confirmed"' 'status confirmed'
    req GET "/v1/reservations/$r3" "" 200
    expect_json '.status == "released"' 'status released'
    req GET /v1/inventory/demo-widget "" 200

    note "multi-line order through the router: all lines or none"
    req POST "/v1/orders/$run-o1/reservations" '{"lines":[{"sku":"demo-gadget","quantity":2},{"sku":"demo-gizmo","quantity":1}]}' '200|201'
    req POST "/v1/orders/$run-o2/reservations" '{"lines":[{"sku":"demo-gadget","quantity":1},{"sku":"demo-gizmo","quantity":999}]}' 409
    req GET /v1/inventory/demo-gadget "" 200
    req GET /v1/inventory/demo-gizmo "" 200

    echo
    if ((DEMO_FAILS)); then
        err "demo: $DEMO_FAILS unexpected answer(s), see '!!' above"
        return 1
    fi
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
