#!/usr/bin/env bash
# One benchmark invocation, one table: naive baselines and the allocator on the same private,
# durable PostgreSQL (fsync and synchronous_commit on for every row).
#
#   ops/bench.sh              build release binaries, start 1 allocator + 1 router on a private
#                             durable PostgreSQL and a private Redis (ops/cluster.sh), run every
#                             row in turn, stop everything, print a Markdown table on stdout
#   ops/bench.sh --help
#
# Rows (each BENCH_CONCURRENCY clients for BENCH_DURATION seconds, one after the other):
#   pgbench hot / uniform   the naive fenced single-statement reserve (ops/bench/naive_reserve_*.sql:
#                           one UPDATE joining the lease row) on one hot row / uniform over 100k rows
#   redis hot / uniform     redis-benchmark EVALSHA of a Lua check-and-decrement (ops/bench/reserve.lua)
#   allocator / router      `loadtest run` (closed loop, reserve only) straight to the allocator and
#                           through the router, for: one hot SKU; hot:0.9 over 1,000 SKUs;
#                           zipf:1.1 over 100k SKUs; uniform over 100k SKUs
#   open loop               `loadtest run --rate` at BENCH_OPEN_FRACTION (0.8) of the measured
#                           router zipf throughput, latency from each request's intended start
# Ratios: hot rows against pgbench hot, spread rows against pgbench uniform. Every allocator row
# uses freshly loaded SKUs (ops/bench/seed.sql with partitions from `loadtest partitions`) and
# ends with loadtest's invariant checks.
#
# Knobs (environment): BENCH_DURATION (12 s), BENCH_CONCURRENCY (64), BENCH_PARTITIONS (16),
# BENCH_OPEN_FRACTION (0.8), BENCH_MAX_IN_FLIGHT (256, open loop), BENCH_SKIP_BUILD=1,
# BENCH_DIR (.cluster/bench: per-row reports, logs, results.tsv, table.md). Allocator / router
# knobs pass through (ALLOCATOR_BATCH_MAX, ALLOCATOR_POOL_SIZE, CLUSTER_ALLOCATOR_ARGS, ...).
# Needs pgbench (postgresql-client, a dependency of postgresql) and redis-benchmark (redis-tools,
# a dependency of redis-server); ops/lib.sh's ensure_packages installs those two servers.
#
# Exit status 0 when every row ran and every invariant check passed, 1 otherwise. Everything
# started is stopped at the end, also on Ctrl-C, SIGTERM or an error.
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

for arg in "$@"; do
    case "$arg" in
        -h | --help) print_header_usage "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument '$arg' (try --help)" ;;
    esac
done

DURATION="${BENCH_DURATION:-12}"
CONCURRENCY="${BENCH_CONCURRENCY:-64}"
PARTITIONS="${BENCH_PARTITIONS:-16}"
OPEN_FRACTION="${BENCH_OPEN_FRACTION:-0.8}"
MAX_IN_FLIGHT="${BENCH_MAX_IN_FLIGHT:-256}"
BENCH_DIR="${BENCH_DIR:-$REPO_ROOT/.cluster/bench}"
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
LOADTEST="$TARGET_DIR/release/loadtest"
BENCH_SQL="$OPS_DIR/bench"
STOCK=1000000000
SPREAD_SKUS=100000

for v in DURATION CONCURRENCY PARTITIONS MAX_IN_FLIGHT; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "BENCH_$v must be a positive integer, got '${!v}'"
done
[[ "$OPEN_FRACTION" =~ ^0?\.[0-9]+$|^1(\.0*)?$ ]] || die "BENCH_OPEN_FRACTION must be in (0, 1]"

# --- cleanup -------------------------------------------------------------------------------------

CHILD=""
CLUSTER_UP=""
CLUSTER_STATE="$BENCH_DIR/cluster"

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
    if [[ -n "$CLUSTER_UP" ]]; then
        info "stopping the benchmark cluster"
        CLUSTER_DIR="$CLUSTER_STATE" CLUSTER_STOP_TIMEOUT=15 "$OPS_DIR/cluster.sh" down \
            >>"$BENCH_DIR/cluster.down.log" 2>&1 || warn "ops/cluster.sh down failed (see $BENCH_DIR/cluster.down.log)"
    fi
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
command -v redis-benchmark >/dev/null 2>&1 || die "redis-benchmark not found (apt-get install redis-tools)"
if [[ -n "${BENCH_SKIP_BUILD:-}" ]]; then
    info "BENCH_SKIP_BUILD set: not building"
else
    command -v cargo >/dev/null 2>&1 || die "cargo not found (install Rust via rustup)"
    step "cargo build --release -p allocator -p router -p loadtest"
    run_child cargo build --manifest-path "$REPO_ROOT/Cargo.toml" --release \
        -p allocator -p router -p loadtest || die "cargo build failed"
fi
for bin in "$LOADTEST" "$TARGET_DIR/release/allocator" "$TARGET_DIR/release/router"; do
    [[ -x "$bin" ]] || die "$bin not found (build it or unset BENCH_SKIP_BUILD)"
done
mkdir -p "$BENCH_DIR"
RESULTS="$BENCH_DIR/results.tsv"
: >"$RESULTS"
FAILED=0
START=$SECONDS

# --- cluster -------------------------------------------------------------------------------------

step "cluster: private durable PostgreSQL, private Redis, 1 allocator, 1 router ($PARTITIONS partitions)"
CLUSTER_UP=1
if ! run_child env CLUSTER_DIR="$CLUSTER_STATE" CLUSTER_PRIVATE=1 CLUSTER_PG_DURABLE=1 \
    CLUSTER_SKIP_BUILD=1 CLUSTER_ALLOCATORS=1 CLUSTER_ROUTERS=1 CLUSTER_PARTITIONS="$PARTITIONS" \
    CLUSTER_READY_TIMEOUT=60 CLUSTER_MAP_TIMEOUT=30 "$OPS_DIR/cluster.sh" up >"$BENCH_DIR/cluster.up.log" 2>&1; then
    tail -n 25 "$BENCH_DIR/cluster.up.log" >&2 || true
    die "cluster up failed (log $BENCH_DIR/cluster.up.log)"
fi
# shellcheck disable=SC1091
source "$CLUSTER_STATE/cluster.env"
ALLOCATOR_URL="${ALLOCATOR_URLS%% *}"
PG_HOSTPORT="${DATABASE_URL#*@}"
PG_HOSTPORT="${PG_HOSTPORT%%/*}"
PG_PORT="${PG_HOSTPORT##*:}"
REDIS_PORT="${REDIS_URL#redis://}"
REDIS_PORT="${REDIS_PORT%%/*}"
REDIS_PORT="${REDIS_PORT##*:}"
psql_db() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
PG_SETTINGS="$(psql_db -At "$DATABASE_URL" -c "SELECT 'fsync=' || current_setting('fsync') || ', synchronous_commit=' || current_setting('synchronous_commit') || ', PostgreSQL ' || current_setting('server_version')")"
info "allocator $ALLOCATOR_URL, router $ROUTER_URL, $PG_SETTINGS"
[[ "$PG_SETTINGS" == "fsync=on, synchronous_commit=on"* ]] || die "PostgreSQL is not durable: $PG_SETTINGS"

# row NAME SYSTEM WORKLOAD CLASS TPS P50 P99 P999 INVARIANTS NOTE: one line of results.tsv.
row() { local IFS=$'\t'; printf '%s\n' "$*" >>"$RESULTS"; }

# class_of KIND: the ratio class of a baseline row (hot rows against hot, spread against uniform).
class_of() { if [[ $1 == hot ]]; then echo hot; else echo spread; fi; }

# percentiles FILE: "p50 p99 p99.9" in ms of the microsecond values in FILE (one a line).
percentiles() {
    sort -n "$1" | awk '{ v[NR] = $1 } END {
        if (NR == 0) { print "0 0 0"; exit }
        split("0.5 0.99 0.999", q, " ")
        for (i = 1; i <= 3; i++) { k = int(q[i] * NR + 0.999999); if (k < 1) k = 1; if (k > NR) k = NR; printf "%.2f%s", v[k] / 1000, (i < 3 ? " " : "\n") }
    }'
}

# --- pgbench -------------------------------------------------------------------------------------

NAIVE_URL="postgres://postgres@127.0.0.1:$PG_PORT/allocator_naive"
step "pgbench: naive fenced single-statement reserve"
"$PG_BIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres allocator_naive
psql_db "$NAIVE_URL" -v partitions="$PARTITIONS" -v stock="$STOCK" -v skus="$SPREAD_SKUS" \
    -f "$BENCH_SQL/naive_init.sql"
for kind in hot uniform; do
    prefix="$BENCH_DIR/pgbench_$kind"
    rm -f "$prefix".*
    info "pgbench $kind: $CONCURRENCY clients, ${DURATION}s"
    if run_child "$PGBENCH" -n -M prepared -c "$CONCURRENCY" -j 2 -T "$DURATION" \
        -f "$BENCH_SQL/naive_reserve_$kind.sql" -l --log-prefix="$prefix" "$NAIVE_URL" >"$prefix.txt" 2>&1; then
        tps="$(awk '/^tps = / && /without initial connection time/ { print $3 }' "$prefix.txt")"
        cat "$prefix".[0-9]* | awk '{ print $3 }' >"$prefix.us"
        read -r p50 p99 p999 <<<"$(percentiles "$prefix.us")"
        row "pgbench" "naive fenced UPDATE" "$kind" "$(class_of "$kind")" "$tps" "$p50" "$p99" "$p999" "-" ""
    else
        tail -n 5 "$prefix.txt" >&2
        row "pgbench" "naive fenced UPDATE" "$kind" "$(class_of "$kind")" "failed" 0 0 0 "-" ""
        FAILED=1
    fi
done

# --- redis ---------------------------------------------------------------------------------------

step "redis-benchmark: Lua check-and-decrement (EVALSHA)"
redis-cli -p "$REDIS_PORT" -n 1 FLUSHDB >/dev/null
redis-cli -p "$REDIS_PORT" -n 1 EVAL "for i = 0, $((SPREAD_SKUS - 1)) do redis.call('HSET', string.format('s:%012d', i), 'a', $STOCK, 'h', 0) end return 1" 0 >/dev/null
SHA="$(redis-cli -p "$REDIS_PORT" SCRIPT LOAD "$(cat "$BENCH_SQL/reserve.lua")")"
for kind in hot uniform; do
    out="$BENCH_DIR/redis_$kind.txt"
    args=(-p "$REDIS_PORT" --dbnum 1 -c "$CONCURRENCY")
    if [[ $kind == hot ]]; then key='s:000000000000'; else key='s:__rand_int__'; args+=(-r "$SPREAD_SKUS"); fi
    # redis-benchmark counts requests, not seconds: a 1 s calibration sizes the run to the duration.
    rps="$(redis-benchmark "${args[@]}" -n 20000 -q EVALSHA "$SHA" 1 "$key" 2>/dev/null | tr '\r' '\n' \
        | awk '/requests per second/ { for (i = 1; i <= NF; i++) if ($i == "requests") v = $(i - 1) } END { print int(v) }')"
    n=$(( (rps > 0 ? rps : 10000) * DURATION ))
    info "redis $kind: $CONCURRENCY clients, $n requests (~${DURATION}s at the calibrated rate)"
    if run_child redis-benchmark "${args[@]}" -n "$n" EVALSHA "$SHA" 1 "$key" >"$out" 2>&1; then
        tr '\r' '\n' <"$out" | awk -v kind="$kind" -v class="$(class_of "$kind")" '
            /throughput summary:/ { tps = $3 }
            /^ *[0-9.]+% <= [0-9.]+ milliseconds/ { p = $1 + 0; if (p >= 99.9 && p999 == "") p999 = $3 }
            /latency summary/ { getline; getline; p50 = $3; p99 = $5 }
            END { printf "redis\tLua EVALSHA\t%s\t%s\t%s\t%s\t%s\t%s\t-\t\n", kind, class, tps, p50, p99, p999 }' >>"$RESULTS"
    else
        row "redis" "Lua EVALSHA" "$kind" "$(class_of "$kind")" "failed" 0 0 0 "-" ""
        FAILED=1
    fi
done

# --- allocator -----------------------------------------------------------------------------------

# seed PREFIX SKUS: fresh SKUs straight into PostgreSQL.
seed() {
    "$LOADTEST" partitions --prefix "$1" --skus "$2" --partitions "$PARTITIONS" \
        | psql_db "$DATABASE_URL" -v stock="$STOCK" -f "$BENCH_SQL/seed.sql" >/dev/null
}

# loadtest_row SYSTEM URL WORKLOAD CLASS SKUS SKEW [EXTRA...]: seed, run, record.
loadtest_row() {
    local system=$1 url=$2 workload=$3 class=$4 skus=$5 skew=$6 rc=0
    shift 6
    ROW_N=$((ROW_N + 1))
    local name="row${ROW_N}_${system}" prefix="bench${ROW_N}"
    info "$system $workload: seeding $skus SKUs ($prefix-*), then ${DURATION}s $*"
    seed "$prefix" "$skus" || { row "$system" "$system" "$workload" "$class" "failed" 0 0 0 "seed failed" ""; FAILED=1; return 0; }
    run_child "$LOADTEST" run --target "$url" --skus "$skus" --prefix "$prefix" --skew "$skew" \
        --concurrency "$CONCURRENCY" --duration-secs "$DURATION" --confirm-ratio 0 --release-ratio 0 \
        --snapshot-max 0 --progress-secs 0 --seed 42 --json-out "$BENCH_DIR/$name.json" "$@" \
        >"$BENCH_DIR/$name.txt" 2>"$BENCH_DIR/$name.err" || rc=$?
    if [[ -s "$BENCH_DIR/$name.json" ]] && ((rc == 0 || rc == 1)); then
        jq -r --arg s "$system" --arg w "$workload" --arg c "$class" '[$s, (if .config.rate then "open loop " + (.config.rate | floor | tostring) + "/s" else $s end), $w, $c,
            .reserves_per_sec, .ops.reserve.latency.p50_ms, .ops.reserve.latency.p99_ms, .ops.reserve.latency.p999_ms,
            (if .invariants.ok then "OK" else "FAILED" end),
            (if .pacing then "late \(.pacing.started_late), not started \(.pacing.not_started)" else "" end)] | @tsv' \
            "$BENCH_DIR/$name.json" >>"$RESULTS"
        ((rc == 0)) || { FAILED=1; cat "$BENCH_DIR/$name.txt" >&2; }
    else
        err "$system $workload: loadtest failed (exit $rc): $(tail -n 3 "$BENCH_DIR/$name.err")"
        row "$system" "$system" "$workload" "$class" "failed" 0 0 0 "-" ""
        FAILED=1
    fi
}

ROW_N=0
WORKLOADS=("1 hot SKU|hot|1|uniform" "hot:0.9 over 1,000|hot|1000|hot:0.9"
    "zipf:1.1 over 100k|spread|$SPREAD_SKUS|zipf:1.1" "uniform over 100k|spread|$SPREAD_SKUS|uniform")
for system in allocator router; do
    url=$ALLOCATOR_URL
    [[ $system == router ]] && url=$ROUTER_URL
    step "$system: loadtest closed loop, reserve only"
    for w in "${WORKLOADS[@]}"; do
        IFS='|' read -r workload class skus skew <<<"$w"
        loadtest_row "$system" "$url" "$workload" "$class" "$skus" "$skew"
    done
done

step "open loop at $OPEN_FRACTION of the router's zipf throughput"
peak="$(awk -F'\t' '$1 == "router" && $3 ~ /^zipf/ { print $5 }' "$RESULTS")"
if [[ "$peak" =~ ^[0-9.]+$ ]] && awk -v p="$peak" 'BEGIN { exit !(p > 0) }'; then
    rate="$(awk -v p="$peak" -v f="$OPEN_FRACTION" 'BEGIN { printf "%.1f", p * f }')"
    loadtest_row "router" "$ROUTER_URL" "zipf:1.1 over 100k" spread "$SPREAD_SKUS" zipf:1.1 \
        --rate "$rate" --max-in-flight "$MAX_IN_FLIGHT"
else
    warn "no router zipf throughput measured; open-loop row skipped"
    FAILED=1
fi

# --- table ---------------------------------------------------------------------------------------

TABLE="$BENCH_DIR/table.md"
{
    echo "Durable PostgreSQL ($PG_SETTINGS), $CONCURRENCY clients, ${DURATION}s per row, $PARTITIONS partitions,"
    echo "1 allocator + 1 router, $(nproc 2>/dev/null || echo '?') CPUs shared by servers and load generators."
    echo
    echo "| system | workload | throughput /s | p50 ms | p99 ms | p99.9 ms | vs naive pgbench | invariants | notes |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"
    awk -F'\t' '
        $1 == "pgbench" && $6 != "failed" { base[$4] = $5 }
        { line[NR] = $0 }
        END {
            for (i = 1; i <= NR; i++) {
                split(line[i], f, "\t")
                ratio = "-"
                if (f[5] != "failed" && (f[4] in base) && base[f[4]] > 0) ratio = sprintf("%.2fx", f[5] / base[f[4]])
                tput = (f[5] == "failed") ? "failed" : sprintf("%.0f", f[5])
                printf "| %s | %s | %s | %.2f | %.2f | %.2f | %s | %s | %s |\n", f[2], f[3], tput, f[6], f[7], f[8], ratio, f[9], f[10]
            }
        }' "$RESULTS"
    echo
    echo "Ratios: hot rows against pgbench hot, spread rows against pgbench uniform. allocator/router rows"
    echo "are reserve operations per second through the HTTP API (each a fenced transaction with its"
    echo "reservation and ledger rows); pgbench and redis rows are single statements / scripts."
} >"$TABLE"
echo
cat "$TABLE"
info "benchmark done in $((SECONDS - START))s (build excluded); reports in ${BENCH_DIR#"$REPO_ROOT"/}"
exit "$FAILED"
