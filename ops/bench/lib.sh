# shellcheck shell=bash
# Shared pieces of the database-level benchmarks (ops/bench/fenced-cost.sh, ops/bench/growth.sh).
# Source it after ops/lib.sh, with DIR (the run's directory), PARTITIONS and PG_BIN set; do not
# execute it.
#
# Provides: cleanup of what the run started on exit (the allocator, the private servers),
# bench_services_up (a private durable PostgreSQL and Redis from ops/services.sh, i.e. testkit's
# servers through the cluster launcher; its env sourced,
# PG_PORT), psql_db, and bench_start_allocator / bench_stop_allocator (one replica that owns
# every partition; ALLOC_PID, ALLOC_URL).

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    echo "ops/bench/lib.sh holds helpers for the benchmark scripts; source it, do not run it" >&2
    exit 2
fi

ALLOC_PID=""
SERVICES_UP=""
export CLUSTER_DIR="$DIR/cluster"

bench_cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    [[ -n "$ALLOC_PID" ]] && { kill -TERM "$ALLOC_PID" 2>/dev/null || true; wait "$ALLOC_PID" 2>/dev/null || true; }
    [[ -n "$SERVICES_UP" ]] && { "$OPS_DIR/services.sh" down >>"$DIR/services.log" 2>&1 || warn "services down failed"; }
    exit "$rc"
}
trap bench_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# bench_services_up DB_NAME PG_OPTIONS: a private durable PostgreSQL (with PG_OPTIONS) and Redis;
# sources their env file (DATABASE_URL, …) and sets PG_PORT.
bench_services_up() {
    SERVICES_UP=1
    CLUSTER_PRIVATE=1 CLUSTER_PG_DURABLE=1 CLUSTER_DB_NAME="$1" CLUSTER_PG_OPTIONS="$2" \
        "$OPS_DIR/services.sh" up >"$DIR/services.log" 2>&1 || { tail -n 20 "$DIR/services.log" >&2; die "services up failed"; }
    # shellcheck disable=SC1091
    source "$CLUSTER_DIR/env"
    PG_PORT="${DATABASE_URL##*:}"; PG_PORT="${PG_PORT%%/*}"
}

psql_db() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }

# bench_start_allocator BIN DATABASE_URL REPLICA_ID FLAGS...: one replica on a free port, logging
# to $DIR/allocator-REPLICA_ID.log; returns once it owns all PARTITIONS (ALLOC_PID, ALLOC_URL).
# With BENCH_TOKEN_FILE set, the partition map is read with that bearer token.
bench_start_allocator() {
    local bin=$1 url=$2 id=$3 port auth=()
    shift 3
    [[ -n "${BENCH_TOKEN_FILE:-}" ]] && auth=(-H "Authorization: Bearer $(tr -d '[:space:]' <"$BENCH_TOKEN_FILE")")
    port="$(free_port)"
    RUST_LOG=warn "$bin" serve --database-url "$url" --listen "127.0.0.1:$port" \
        --replica-id "$id" "$@" >>"$DIR/allocator-$id.log" 2>&1 &
    ALLOC_PID=$!
    ALLOC_URL="http://127.0.0.1:$port"
    wait_http "$ALLOC_URL/readyz" 60 || die "allocator $id not ready"
    until [[ "$(curl -fsS "${auth[@]}" "$ALLOC_URL/v1/partitions" | jq --arg id "$id" '[.partitions[] | select(.owner_id == $id)] | length')" == "$PARTITIONS" ]]; do
        sleep 0.2
    done
}

bench_stop_allocator() { kill -TERM "$ALLOC_PID"; wait "$ALLOC_PID" || true; ALLOC_PID=""; }
