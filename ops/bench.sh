#!/usr/bin/env bash
# One benchmark invocation, one table of throughput, latency and CPU cost per operation: naive
# baselines and the allocator on the same private, durable PostgreSQL (fsync and
# synchronous_commit on for every row).
#
#   ops/bench.sh              build release binaries, start 1 allocator + 1 router on a private
#                             durable PostgreSQL and a private Redis (ops/cluster.sh), run every
#                             row in turn, stop everything, print a Markdown table on stdout
#   ops/bench.sh --short      the same rows for 4 s each and without the Redis rows: a couple of
#                             minutes after the build, for a quick comparison
#   ops/bench.sh --compare DIR
#                             A/B of two builds in one invocation: DIR holds the baseline's
#                             allocator, router and loadtest binaries; a second cluster runs them
#                             beside the current build's, and BENCH_ROUNDS (2) rounds alternate
#                             baseline and current on the same rows: closed loop uniform direct,
#                             zipf routed, and open loop zipf at BENCH_COMPARE_RATE (1000/s)
#                             direct and routed. Prints both and the ratios of throughput and of
#                             CPU per operation (no pgbench or Redis rows). With BENCH_SHARDS=2
#                             BENCH_ALLOCATORS=2 both clusters span two shards and only the
#                             routed rows run (zipf and uniform closed loop, zipf open loop)
#   ops/bench.sh --relay      the change-event relay's cost, in one invocation: two clusters of the
#                             current build, the relay off (baseline) and on (`--events true`,
#                             current); BENCH_ROUNDS rounds alternate them on closed-loop hot and
#                             zipf rows, direct and routed, and open loop zipf routed at
#                             BENCH_COMPARE_RATE; prints both, the ratios, and what the relay
#                             published and still lagged at the end
#   ops/bench.sh --shards     one shard (baseline) against two (current), 2 allocators and a
#                             router each, same build: routed zipf, uniform and open-loop zipf
#                             rows; CPU summed over the shards' servers and the allocators
#   ops/bench.sh --pgbouncer  the services' sessions direct (baseline) and through PgBouncer in
#                             session mode (current), same build and PostgreSQL server (a
#                             database each): the --compare rows, BENCH_ROUNDS rounds
#                             alternating; PgBouncer's CPU counts in the PostgreSQL column
#   ops/bench.sh --profile    where the CPU goes at BENCH_OPEN_FRACTIONS (default 0.25 here) of
#                             the routed peak: only the closed-loop zipf rows (for the peak) and
#                             the open-loop rows, each open-loop row under `perf record -g -a` with
#                             pg_stat_statements reset before it; prints each one's share per
#                             process, top functions and top statements (ops/bench/profile.sh)
#   ops/bench.sh growth [--help]
#                             whether a reserve's cost grows with history, and table sizes under
#                             a short idempotency horizon: ops/bench/growth.sh (its own knobs)
#   ops/bench.sh --help
#
# Rows, one after the other, each BENCH_DURATION seconds:
#   closed loop (BENCH_CONCURRENCY clients), for uniform over BENCH_SKUS SKUs, zipf:1.1 over
#   BENCH_SKUS SKUs and one hot SKU:
#     pgbench     the naive fenced single-statement reserve (ops/bench/naive_reserve_*.sql: one
#                 UPDATE joining the lease row), prepared
#     allocator   `loadtest run` (reserve only) straight to the allocator
#     router      the same through the router
#   open loop at each of BENCH_OPEN_FRACTIONS (25 %, 50 %, 80 %) of the router's closed-loop zipf
#   throughput (the routed peak), zipf over BENCH_SKUS SKUs: pgbench -R at that rate, and
#   `loadtest run --rate` direct and through the router. Latency counts from each request's
#   intended start in both (pgbench's per-transaction latency under -R includes its schedule lag).
#   redis (full mode)  redis-benchmark EVALSHA of a Lua check-and-decrement (ops/bench/reserve.lua)
#
# Every row reports CPU microseconds per operation of PostgreSQL (the postmaster and all its
# backends), the allocator, the router and the load generator, read from /proc over the row's
# load (`loadtest run --cpu-watch`, and `loadtest cpu` around pgbench). Under the table, the
# targets line up the figures they are about. Ratios: closed-loop hot rows against pgbench hot,
# spread rows against pgbench uniform; open-loop rows' p50 and p99 against pgbench at the same
# rate. Under the table, each open-loop row's stages (ops/bench/stages.sh): count, mean, p50 and
# p99 of every allocator and router stage, beside the totals. Every allocator row uses freshly loaded SKUs (ops/bench/seed.sql with partitions from
# `loadtest partitions`) and ends with loadtest's invariant checks.
#
# Knobs (environment): BENCH_DURATION (12 s; 4 with --short), BENCH_CONCURRENCY (64),
# BENCH_PARTITIONS (16), BENCH_SKUS (10000), BENCH_OPEN_FRACTIONS ("0.25 0.5 0.8"),
# BENCH_MAX_IN_FLIGHT (256, open loop), BENCH_REDIS (1; 0 with --short), BENCH_SKIP_BUILD=1,
# BENCH_DIR (.cluster/bench: per-row reports, logs, results.tsv, table.md). Allocator / router
# knobs pass through (ALLOCATOR_BATCH_MAX, ALLOCATOR_POOL_SIZE, CLUSTER_ALLOCATOR_ARGS,
# CLUSTER_ALLOCATOR_BIN, CLUSTER_ROUTER_BIN, ...).
# Needs pgbench (postgresql-client, a dependency of postgresql) and, for the Redis rows,
# redis-benchmark (redis-tools, a dependency of redis-server); ops/lib.sh's ensure_packages
# installs those two servers.
#
# Exit status 0 when every row ran and every invariant check passed, 1 otherwise (a missed
# target is reported, not an error). Everything started is stopped at the end, also on Ctrl-C,
# SIGTERM or an error.
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SHORT=""
COMPARE=""
RELAY=""
SHARDS_AB=""
PGBOUNCER=""
PROFILE=""
while (($#)); do
    case "$1" in
        growth) shift; exec "$OPS_DIR/bench/growth.sh" "$@" ;;
        --short) SHORT=1 ;;
        --compare)
            [[ $# -ge 2 ]] || die "--compare needs a directory with the baseline's binaries"
            COMPARE="$(cd "$2" && pwd)" || die "--compare: no directory $2"
            shift
            ;;
        --relay) RELAY=1 ;;
        --shards) SHARDS_AB=1 ;;
        --pgbouncer) PGBOUNCER=1 ;;
        --profile) PROFILE=1 ;;
        -h | --help) print_header_usage "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument '$1' (try --help)" ;;
    esac
    shift
done

DURATION="${BENCH_DURATION:-${SHORT:+4}}"
DURATION="${DURATION:-12}"
REDIS_ROWS="${BENCH_REDIS:-$([[ -n "$SHORT$PROFILE" ]] && echo 0 || echo 1)}"
CONCURRENCY="${BENCH_CONCURRENCY:-64}"
PARTITIONS="${BENCH_PARTITIONS:-16}"
SKUS="${BENCH_SKUS:-10000}"
OPEN_FRACTIONS="${BENCH_OPEN_FRACTIONS:-$([[ -n "$PROFILE" ]] && echo 0.25 || echo 0.25 0.5 0.8)}"
MAX_IN_FLIGHT="${BENCH_MAX_IN_FLIGHT:-256}"
ROUNDS="${BENCH_ROUNDS:-2}"
COMPARE_RATE="${BENCH_COMPARE_RATE:-1000}"
BENCH_DIR="${BENCH_DIR:-$REPO_ROOT/.cluster/bench}"
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
LOADTEST="$TARGET_DIR/release/loadtest"
BENCH_SQL="$OPS_DIR/bench"
STOCK=1000000000

for v in DURATION CONCURRENCY PARTITIONS SKUS MAX_IN_FLIGHT ROUNDS COMPARE_RATE; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "BENCH_$v must be a positive integer, got '${!v}'"
done
for f in $OPEN_FRACTIONS; do
    [[ "$f" =~ ^0?\.[0-9]+$|^1(\.0*)?$ ]] || die "BENCH_OPEN_FRACTIONS: '$f' is not in (0, 1]"
done
[[ "$REDIS_ROWS" =~ ^[01]$ ]] || die "BENCH_REDIS must be 0 or 1"

# --- cleanup -------------------------------------------------------------------------------------

CHILD=""
# State directories of the clusters started (stopped by the trap).
CLUSTERS=()

# run_child CMD...: runs CMD in its own process group and waits, so a signal reaches our trap at
# once and the trap can stop CMD's whole group.
run_child() {
    local rc=0
    setsid -w "$@" </dev/null &
    CHILD=$!
    wait "$CHILD" || rc=$?
    CHILD=""
    return "$rc"
}

# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [[ -n "$CHILD" ]]; then
        kill -TERM -- "-$CHILD" 2>/dev/null || kill -TERM "$CHILD" 2>/dev/null || true
        wait "$CHILD" 2>/dev/null || true
    fi
    local state
    for state in "${CLUSTERS[@]}"; do
        info "stopping the benchmark cluster in ${state#"$REPO_ROOT"/}"
        CLUSTER_DIR="$state" CLUSTER_STOP_TIMEOUT=15 "$OPS_DIR/cluster.sh" down \
            >>"$BENCH_DIR/cluster.down.log" 2>&1 || warn "ops/cluster.sh down failed (see $BENCH_DIR/cluster.down.log)"
    done
    [[ -z "${BOUNCER_PID:-}" ]] || kill "$BOUNCER_PID" 2>/dev/null || true
    exit "$rc"
}
trap cleanup EXIT
trap 'err "interrupted"; exit 130' INT
trap 'err "terminated"; exit 143' TERM

# --- tools and build -----------------------------------------------------------------------------

step "packages"
ensure_packages postgresql redis curl jq
PG_BIN="$(pg_bin_dir)" || die "no PostgreSQL server binaries"
PGBENCH="$(command -v pgbench || true)"
[[ -n "$PGBENCH" ]] || PGBENCH="$PG_BIN/pgbench"
[[ -x "$PGBENCH" ]] || die "pgbench not found (apt-get install postgresql-client)"
if ((REDIS_ROWS)); then
    command -v redis-benchmark >/dev/null 2>&1 || die "redis-benchmark not found (apt-get install redis-tools, or BENCH_REDIS=0)"
fi
if [[ -n "${BENCH_SKIP_BUILD:-}" ]]; then
    info "BENCH_SKIP_BUILD set: not building"
else
    command -v cargo >/dev/null 2>&1 || die "cargo not found (install Rust via rustup)"
    step "cargo build --release -p allocator -p router -p loadtest -p testkit"
    run_child cargo build --manifest-path "$REPO_ROOT/Cargo.toml" --release \
        -p allocator -p router -p loadtest -p testkit || die "cargo build failed"
fi
for bin in "$LOADTEST" "${CLUSTER_ALLOCATOR_BIN:-$TARGET_DIR/release/allocator}" "${CLUSTER_ROUTER_BIN:-$TARGET_DIR/release/router}"; do
    [[ -x "$bin" ]] || die "$bin not found (build it or unset BENCH_SKIP_BUILD)"
done
if [[ -n "$COMPARE" ]]; then
    for bin in allocator router loadtest; do
        [[ -x "$COMPARE/$bin" ]] || die "--compare: $COMPARE/$bin not found"
    done
fi
mkdir -p "$BENCH_DIR"
RESULTS="$BENCH_DIR/results.tsv"
STAGES="$BENCH_DIR/stages.tsv"
: >"$RESULTS"
: >"$STAGES"
FAILED=0
START=$SECONDS

# --- cluster -------------------------------------------------------------------------------------

# start_cluster NAME ALLOCATOR_BIN ROUTER_BIN: a private durable PostgreSQL, a private Redis, one
# allocator and one router in $BENCH_DIR/NAME; sets the cluster's globals (use_cluster).
start_cluster() {
    local name=$1 state="$BENCH_DIR/$1"
    step "cluster $name: private durable PostgreSQL (${BENCH_SHARDS:-1} shard(s)), private Redis, ${BENCH_ALLOCATORS:-1} allocator(s), 1 router ($PARTITIONS partitions)"
    CLUSTERS+=("$state")
    # Not the previous cluster's DATABASE_URL (use_cluster exports it): a router given it and
    # --shard refuses to start.
    if ! run_child env -u DATABASE_URL -u SHARD_URLS CLUSTER_DIR="$state" CLUSTER_PRIVATE=1 CLUSTER_PG_DURABLE=1 \
        CLUSTER_SKIP_BUILD=1 CLUSTER_ALLOCATORS="${BENCH_ALLOCATORS:-1}" CLUSTER_ROUTERS=1 \
        CLUSTER_SHARDS="${BENCH_SHARDS:-1}" CLUSTER_PARTITIONS="$PARTITIONS" \
        CLUSTER_ALLOCATOR_BIN="$2" CLUSTER_ROUTER_BIN="$3" \
        CLUSTER_READY_TIMEOUT=60 CLUSTER_MAP_TIMEOUT=30 "$OPS_DIR/cluster.sh" up >"$BENCH_DIR/$name.up.log" 2>&1; then
        tail -n 25 "$BENCH_DIR/$name.up.log" >&2 || true
        die "cluster up failed (log $BENCH_DIR/$name.up.log)"
    fi
    use_cluster "$name"
    local settings
    settings="$(psql_db -At "$DATABASE_URL" -c "SELECT 'fsync=' || current_setting('fsync') || ', synchronous_commit=' || current_setting('synchronous_commit') || ', PostgreSQL ' || current_setting('server_version')")"
    info "$name: allocator $ALLOCATOR_URL, router $ROUTER_URL, $settings"
    [[ "$settings" == "fsync=on, synchronous_commit=on"* ]] || die "PostgreSQL is not durable: $settings"
    PG_SETTINGS=$settings
}

# use_cluster NAME: point DATABASE_URL, REDIS_URL, ALLOCATOR_URL, ROUTER_URL, PG_PORT, REDIS_PORT and
# WATCH (the postmaster with its backends, the allocator and the router, whose CPU every row
# reports) at cluster NAME.
use_cluster() {
    local state="$BENCH_DIR/$1" v
    # shellcheck disable=SC1091
    source "$state/cluster.env"
    ALLOCATOR_URL="${ALLOCATOR_URLS%% *}"
    PG_PORT="${DATABASE_URL#*@}"
    PG_PORT="${PG_PORT%%/*}"
    PG_PORT="${PG_PORT##*:}"
    REDIS_PORT="${REDIS_URL#redis://}"
    REDIS_PORT="${REDIS_PORT%%/*}"
    REDIS_PORT="${REDIS_PORT##*:}"
    PG_PID="$(head -n1 "$state/run/postgres.pid" 2>/dev/null || echo "${BOUNCED_PG_PID:-}")"
    ALLOC_PID="$(head -n1 "$state/run/alloc-1.pid" 2>/dev/null || true)"
    ROUTER_PID="$(head -n1 "$state/run/router-1.pid" 2>/dev/null || true)"
    for v in PG_PID ALLOC_PID ROUTER_PID; do
        [[ "${!v}" =~ ^[0-9]+$ ]] && pid_alive "${!v}" || die "cannot find cluster $1's $v"
    done
    WATCH=("postgres=$PG_PID" "allocator=$ALLOC_PID" "router=$ROUTER_PID")
    [[ -z "${BOUNCER_PID:-}" || "$1" != cluster ]] || WATCH+=("postgres-pgbouncer=$BOUNCER_PID")
    SHARD_LIST=()
    [[ -n "$SHARDS_AB" ]] && ab_watch_more "$state"
    return 0
}

psql_db() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
# shellcheck source=ops/bench/ab.sh
source "$BENCH_SQL/ab.sh"
# shellcheck source=ops/bench/stages.sh
source "$BENCH_SQL/stages.sh"
# shellcheck source=ops/bench/profile.sh
source "$BENCH_SQL/profile.sh"
if [[ -n "$PROFILE" ]]; then
    export CLUSTER_PG_OPTIONS="${CLUSTER_PG_OPTIONS:-} -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=top"
fi
ALLOCATOR_BIN="${CLUSTER_ALLOCATOR_BIN:-$TARGET_DIR/release/allocator}"
ROUTER_BIN="${CLUSTER_ROUTER_BIN:-$TARGET_DIR/release/router}"
if [[ -n "$RELAY" ]]; then
    CLUSTER_ALLOCATOR_ARGS="${CLUSTER_ALLOCATOR_ARGS:-} --events true" start_cluster cluster "$ALLOCATOR_BIN" "$ROUTER_BIN"
elif [[ -n "$SHARDS_AB" ]]; then
    BENCH_SHARDS=2 BENCH_ALLOCATORS=2 start_cluster cluster "$ALLOCATOR_BIN" "$ROUTER_BIN"
elif [[ -n "$PGBOUNCER" ]]; then
    start_cluster baseline "$ALLOCATOR_BIN" "$ROUTER_BIN"
    ab_pgbouncer_start
    CLUSTER_DATABASE_URL="$BOUNCER_URL" start_cluster cluster "$ALLOCATOR_BIN" "$ROUTER_BIN"
else
    start_cluster cluster "$ALLOCATOR_BIN" "$ROUTER_BIN"
fi
[[ -z "$PROFILE" ]] || psql_db "$DATABASE_URL" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"
info "CPU from /proc: postgres pid $PG_PID (and its backends), allocator pid $ALLOC_PID, router pid $ROUTER_PID"

# row SYSTEM LABEL WORKLOAD LOAD FRACTION TPS P50 P99 P999 PG_US ALLOC_US ROUTER_US GEN_US INVARIANTS NOTE:
# one line of results.tsv. SYSTEM: pgbench|allocator|router|redis; WORKLOAD: uniform|zipf|hot;
# FRACTION: the open-loop fraction of the routed peak, "-" for closed loop.
row() { local IFS=$'\t'; printf '%s\n' "$*" >>"$RESULTS"; }

# percentiles FILE: "p50 p99 p99.9" in ms of the microsecond values in FILE (one a line).
percentiles() {
    sort -n "$1" | awk '{ v[NR] = $1 } END {
        if (NR == 0) { print "0 0 0"; exit }
        split("0.5 0.99 0.999", q, " ")
        for (i = 1; i <= 3; i++) { k = int(q[i] * NR + 0.999999); if (k < 1) k = 1; if (k > NR) k = NR; printf "%.2f%s", v[k] / 1000, (i < 3 ? " " : "\n") }
    }'
}

workload_label() {
    case $1 in
        uniform) echo "uniform over $SKUS SKUs" ;;
        zipf) echo "zipf:1.1 over $SKUS SKUs" ;;
        hot) echo "1 hot SKU" ;;
    esac
}

# --- pgbench -------------------------------------------------------------------------------------

# naive_tables: the naive baseline's database and tables on the current cluster's PostgreSQL.
naive_tables() {
    NAIVE_URL="postgres://postgres@127.0.0.1:$PG_PORT/allocator_naive"
    step "naive baseline tables ($SKUS rows)"
    "$PG_BIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres allocator_naive
    psql_db "$NAIVE_URL" -v partitions="$PARTITIONS" -v stock="$STOCK" -v skus="$SKUS" \
        -f "$BENCH_SQL/naive_init.sql"
}

# pgbench_row WORKLOAD [FRACTION RATE]: the naive statement, closed loop or at RATE per second.
pgbench_row() {
    local workload=$1 fraction=${2:--} rate=${3:-} load
    ROW_N=$((ROW_N + 1))
    local prefix="$BENCH_DIR/row${ROW_N}_pgbench_$workload"
    local args=(-n -M prepared -c "$CONCURRENCY" -j 2 -T "$DURATION" -D skus="$SKUS"
        -f "$BENCH_SQL/naive_reserve_$workload.sql" -l --log-prefix="$prefix")
    load="closed, $CONCURRENCY clients"
    if [[ -n "$rate" ]]; then
        args+=(-R "$rate")
        load="open $(printf '%.0f' "$rate")/s"
    fi
    rm -f "$prefix".*
    info "pgbench $workload ($load): ${DURATION}s"
    [[ -z "$PROFILE" || -z "$rate" ]] || profile_begin "row${ROW_N}_pgbench_$workload"
    if run_child "$LOADTEST" cpu "${WATCH[@]/#/--watch=}" --name pgbench --out "$prefix.cpu.json" \
        -- "$PGBENCH" "${args[@]}" "$NAIVE_URL" >"$prefix.txt" 2>&1; then
        local tps n p50 p99 p999 cpu
        tps="$(awk '/^tps = / && /without initial connection time/ { print $3 }' "$prefix.txt")"
        n="$(awk -F': ' '/^number of transactions actually processed/ { split($2, a, "/"); print a[1] }' "$prefix.txt")"
        cat "$prefix".[0-9]* | awk '{ print $3 }' >"$prefix.us"
        read -r p50 p99 p999 <<<"$(percentiles "$prefix.us")"
        cpu="$(jq -r --argjson n "${n:-0}" '[("postgres", "allocator", "router", "pgbench") as $name
            | (.processes[] | select(.name == $name) | if $n > 0 then (.cpu_secs * 1e6 / $n * 10 | round / 10) else "-" end)] | @tsv' "$prefix.cpu.json")"
        # shellcheck disable=SC2086 # four tab-separated figures
        row pgbench "naive fenced UPDATE (pgbench)" "$workload" "$load" "$fraction" "$tps" "$p50" "$p99" "$p999" $cpu "-" ""
    else
        tail -n 5 "$prefix.txt" >&2
        row pgbench "naive fenced UPDATE (pgbench)" "$workload" "$load" "$fraction" failed 0 0 0 - - - - "-" ""
        FAILED=1
    fi
    profile_end "row${ROW_N}_pgbench_$workload"
}

# --- allocator and router ------------------------------------------------------------------------

# seed PREFIX SKUS: fresh SKUs straight into PostgreSQL (into each SKU's shard with --shards).
seed() {
    ((${#SHARD_LIST[@]} < 2)) || { ab_seed_shards "$@"; return; }
    "$LOADTEST" partitions --prefix "$1" --skus "$2" --partitions "$PARTITIONS" \
        | psql_db "$DATABASE_URL" -v stock="$STOCK" -f "$BENCH_SQL/seed.sql" >/dev/null
}

# loadtest_row SYSTEM WORKLOAD [FRACTION RATE]: seed, run (closed loop, or open loop at RATE),
# record.
loadtest_row() {
    local system=$1 workload=$2 fraction=${3:--} rate=${4:-} rc=0 url=$ALLOCATOR_URL skus=$SKUS skew label load
    ROW_N=$((ROW_N + 1))
    local name="row${ROW_N}_${system}_$workload" prefix="bench${ROW_N}"
    [[ $system == router ]] && url=$ROUTER_URL
    label="allocator"
    [[ $system == router ]] && label="router → allocator"
    label+="${VARIANT:+ [$VARIANT]}"
    case $workload in
        uniform) skew=uniform ;;
        zipf) skew=zipf:1.1 ;;
        hot) skew=uniform skus=1 ;;
    esac
    local extra=(--concurrency "$CONCURRENCY")
    load="closed, $CONCURRENCY clients"
    if [[ -n "$rate" ]]; then
        extra=(--rate "$rate" --max-in-flight "$MAX_IN_FLIGHT")
        load="open $(printf '%.0f' "$rate")/s"
    fi
    info "$system $workload ($load): seeding $skus SKUs ($prefix-*), then ${DURATION}s"
    if ! seed "$prefix" "$skus"; then
        row "$system" "$label" "$workload" "$load" "$fraction" failed 0 0 0 - - - - "seed failed" ""
        FAILED=1
        return 0
    fi
    if [[ -n "$rate" ]]; then stages_scrape "$BENCH_DIR/$name.stages0"; fi
    [[ -z "$PROFILE" || -z "$rate" ]] || profile_begin "$name"
    run_child "$LOADTEST" run --target "$url" --skus "$skus" --prefix "$prefix" --skew "$skew" \
        --duration-secs "$DURATION" --confirm-ratio 0 --release-ratio 0 \
        --snapshot-max 0 --progress-secs 0 --seed 42 --json-out "$BENCH_DIR/$name.json" \
        "${WATCH[@]/#/--cpu-watch=}" "${extra[@]}" \
        >"$BENCH_DIR/$name.txt" 2>"$BENCH_DIR/$name.err" || rc=$?
    profile_end "$name"
    if [[ -s "$BENCH_DIR/$name.json" ]] && ((rc == 0 || rc == 1)); then
        jq -r --arg s "$system" --arg l "$label" --arg w "$workload" --arg load "$load" --arg f "$fraction" '
            def us($n): [(.cpu.processes // [])[] | select(.name == $n or (.name | startswith($n + "-"))) | .us_per_op]
                | if length == 0 then "-" else add end;
            [$s, $l, $w, $load, $f,
            .reserves_per_sec, .ops.reserve.latency.p50_ms, .ops.reserve.latency.p99_ms, .ops.reserve.latency.p999_ms,
            us("postgres"), us("allocator"), us("router"), us("loadtest"),
            (if .invariants.ok then "OK" else "FAILED" end),
            (if .pacing then "late \(.pacing.started_late), not started \(.pacing.not_started)" else "" end)] | @tsv' \
            "$BENCH_DIR/$name.json" >>"$RESULTS"
        if [[ -n "$rate" ]]; then
            stages_scrape "$BENCH_DIR/$name.stages1"
            stages_record "$label, $load" "$BENCH_DIR/$name.stages0" "$BENCH_DIR/$name.stages1" \
                "$(jq -r '.ops.reserve.latency.mean_ms // ""' "$BENCH_DIR/$name.json")"
        fi
        ((rc == 0)) || { FAILED=1; cat "$BENCH_DIR/$name.txt" >&2; }
    else
        err "$system $workload: loadtest failed (exit $rc): $(tail -n 3 "$BENCH_DIR/$name.err")"
        row "$system" "$label" "$workload" "$load" "$fraction" failed 0 0 0 - - - - "-" ""
        FAILED=1
    fi
}

ROW_N=0
VARIANT=""
[[ -n "$COMPARE$RELAY$SHARDS_AB$PGBOUNCER" ]] && ab_run

naive_tables
for workload in $([[ -n "$PROFILE" ]] && echo zipf || echo uniform zipf hot); do
    step "closed loop, $(workload_label "$workload"): naive, direct, routed"
    pgbench_row "$workload"
    loadtest_row allocator "$workload"
    loadtest_row router "$workload"
done

peak="$(awk -F'\t' '$1 == "router" && $3 == "zipf" && $5 == "-" { print $6 }' "$RESULTS")"
if [[ "$peak" =~ ^[0-9.]+$ ]] && awk -v p="$peak" 'BEGIN { exit !(p > 0) }'; then
    for fraction in $OPEN_FRACTIONS; do
        rate="$(awk -v p="$peak" -v f="$fraction" 'BEGIN { printf "%.1f", p * f }')"
        step "open loop at $fraction of the routed peak ($rate/s of $peak/s), $(workload_label zipf)"
        pgbench_row zipf "$fraction" "$rate"
        loadtest_row allocator zipf "$fraction" "$rate"
        loadtest_row router zipf "$fraction" "$rate"
    done
else
    warn "no routed zipf throughput measured; open-loop rows skipped"
    FAILED=1
fi

# --- redis ---------------------------------------------------------------------------------------

if ((REDIS_ROWS)); then
    step "redis-benchmark: Lua check-and-decrement (EVALSHA)"
    redis-cli -p "$REDIS_PORT" -n 1 FLUSHDB >/dev/null
    redis-cli -p "$REDIS_PORT" -n 1 EVAL "for i = 0, $((SKUS - 1)) do redis.call('HSET', string.format('s:%012d', i), 'a', $STOCK, 'h', 0) end return 1" 0 >/dev/null
    SHA="$(redis-cli -p "$REDIS_PORT" SCRIPT LOAD "$(cat "$BENCH_SQL/reserve.lua")")"
    for kind in hot uniform; do
        out="$BENCH_DIR/redis_$kind.txt"
        args=(-p "$REDIS_PORT" --dbnum 1 -c "$CONCURRENCY")
        if [[ $kind == hot ]]; then key='s:000000000000'; else key='s:__rand_int__'; args+=(-r "$SKUS"); fi
        # redis-benchmark counts requests, not seconds: a 1 s calibration sizes the run to the duration.
        rps="$(redis-benchmark "${args[@]}" -n 20000 -q EVALSHA "$SHA" 1 "$key" 2>/dev/null | tr '\r' '\n' \
            | awk '/requests per second/ { for (i = 1; i <= NF; i++) if ($i == "requests") v = $(i - 1) } END { print int(v) }')"
        n=$(((rps > 0 ? rps : 10000) * DURATION))
        info "redis $kind: $CONCURRENCY clients, $n requests (~${DURATION}s at the calibrated rate)"
        if run_child redis-benchmark "${args[@]}" -n "$n" EVALSHA "$SHA" 1 "$key" >"$out" 2>&1; then
            tr '\r' '\n' <"$out" | awk -v kind="$kind" -v clients="closed, $CONCURRENCY clients" '
                /throughput summary:/ { tps = $3 }
                /^ *[0-9.]+% <= [0-9.]+ milliseconds/ { p = $1 + 0; if (p >= 99.9 && p999 == "") p999 = $3 }
                /latency summary/ { getline; getline; p50 = $3; p99 = $5 }
                END { printf "redis\tLua EVALSHA (redis-benchmark)\t%s\t%s\t-\t%s\t%s\t%s\t%s\t-\t-\t-\t-\t-\t\n", kind, clients, tps, p50, p99, p999 }' >>"$RESULTS"
        else
            row redis "Lua EVALSHA (redis-benchmark)" "$kind" "closed, $CONCURRENCY clients" - failed 0 0 0 - - - - "-" ""
            FAILED=1
        fi
    done
fi

# --- table ---------------------------------------------------------------------------------------

TABLE="$BENCH_DIR/table.md"
{
    echo "Durable PostgreSQL ($PG_SETTINGS), ${DURATION}s per row, $PARTITIONS partitions,"
    echo "1 allocator + 1 router, $(nproc 2>/dev/null || echo '?') CPUs shared by servers and load generators."
    echo
    awk -F'\t' -v skus="$SKUS" -f "$BENCH_SQL/table.awk" "$RESULTS"
    stages_table
    profile_report
} >"$TABLE"
echo
cat "$TABLE"
info "benchmark done in $((SECONDS - START))s (build excluded); reports in ${BENCH_DIR#"$REPO_ROOT"/}"
exit "$FAILED"
