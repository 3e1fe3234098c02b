#!/usr/bin/env bash
# Hot-SKU benchmark: the same closed-loop workload against several deployments, in one run.
#
#   ops/bench.sh              build, then for each scenario: fresh PostgreSQL + Redis, migrate,
#                             start the processes, seed, `loadtest run`, invariant checks, stop;
#                             finally a table (throughput, latency, invariants, ratio to baseline)
#   ops/bench.sh --help
#
# Scenarios (BENCH_SCENARIOS, default "baseline batching cluster"):
#   baseline   1 allocator, ALLOCATOR_BATCH_MAX=1 (one transaction per request)
#   batching   1 allocator, ALLOCATOR_BATCH_MAX=$BENCH_BATCH_MAX (default 64, the allocator default)
#   cluster    3 allocators + 2 routers with batching; load goes through router-1
#
# Every scenario gets its own private PostgreSQL (initdb'ed fresh, so no scenario sees another's
# rows and a shared server's other load does not distort the figures) and Redis, started by
# ops/cluster.sh (via ops/services.sh) in its own state directory under $BENCH_DIR, so a
# developer's cluster in .cluster/ is left alone. That PostgreSQL runs with fsync=off and
# synchronous_commit=off (ops/services.sh), so a commit costs no disk flush: the figures
# understate what batching (one commit per batch) saves against a durable server. Everything started is stopped at the end, also
# on Ctrl-C, SIGTERM or an error.
#
# Workload knobs (environment): BENCH_DURATION (20 s per scenario), BENCH_CONCURRENCY (64),
# BENCH_SKUS (1000), BENCH_SKEW (hot:0.9), BENCH_STOCK (1000000 units per SKU), BENCH_QUANTITY
# (1), BENCH_CONFIRM_RATIO (0.5), BENCH_RELEASE_RATIO (0.3), BENCH_SEED (42),
# BENCH_PARTITIONS (16), BENCH_BATCH_MAX (64).
# Run knobs: BENCH_SCENARIOS, BENCH_PRIVATE (1; 0 lets ops/services.sh use servers on the default
# ports, dropping and recreating its database there), BENCH_SKIP_BUILD=1, BENCH_BUDGET_SECONDS
# (290: scenarios that would not finish within it are skipped; the build is not counted),
# BENCH_DIR (.cluster/bench: logs, per-scenario reports *.txt / *.json, results.tsv).
# Allocator / router knobs pass through the environment (ALLOCATOR_POOL_SIZE,
# ALLOCATOR_HTTP_WORKERS, CLUSTER_ALLOCATOR_ARGS, ...; ALLOCATOR_BATCH_MAX is set per scenario).
#
# Output: progress and per-scenario reports on stderr, the result table on stdout. Exit status 0
# when every scenario ran and passed its invariant checks, 1 otherwise.
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

for arg in "$@"; do
    case "$arg" in
        -h | --help) print_header_usage "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument '$arg' (try --help)" ;;
    esac
done

DURATION="${BENCH_DURATION:-20}"
CONCURRENCY="${BENCH_CONCURRENCY:-64}"
SKUS="${BENCH_SKUS:-1000}"
SKEW="${BENCH_SKEW:-hot:0.9}"
STOCK="${BENCH_STOCK:-1000000}"
QUANTITY="${BENCH_QUANTITY:-1}"
CONFIRM_RATIO="${BENCH_CONFIRM_RATIO:-0.5}"
RELEASE_RATIO="${BENCH_RELEASE_RATIO:-0.3}"
SEED="${BENCH_SEED:-42}"
PARTITIONS="${BENCH_PARTITIONS:-16}"
BATCH_MAX="${BENCH_BATCH_MAX:-64}"
SCENARIOS="${BENCH_SCENARIOS:-baseline batching cluster}"
PRIVATE="${BENCH_PRIVATE:-1}"
BUDGET="${BENCH_BUDGET_SECONDS:-290}"
BENCH_DIR="${BENCH_DIR:-$REPO_ROOT/.cluster/bench}"
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
LOADTEST="$TARGET_DIR/release/loadtest"
PREFIX=bench

for v in DURATION CONCURRENCY SKUS STOCK QUANTITY SEED PARTITIONS BATCH_MAX BUDGET; do
    [[ "${!v}" =~ ^[0-9]+$ ]] || die "BENCH_$v must be a non-negative integer, got '${!v}'"
done
((DURATION >= 1 && CONCURRENCY >= 1 && SKUS >= 1 && PARTITIONS >= 1 && BATCH_MAX >= 1)) \
    || die "BENCH_DURATION, BENCH_CONCURRENCY, BENCH_SKUS, BENCH_PARTITIONS and BENCH_BATCH_MAX must be >= 1"
for s in $SCENARIOS; do
    [[ "$s" =~ ^(baseline|batching|cluster)$ ]] || die "unknown scenario '$s' in BENCH_SCENARIOS (baseline, batching, cluster)"
done

# --- cleanup -------------------------------------------------------------------------------------

CHILD=""         # pid of the long-running command we are waiting for
ACTIVE_DIRS=()   # scenario state dirs whose cluster may be running

# run_child [--out FILE | --all FILE] CMD...: runs CMD in the background, in its own process group
# (setsid), and waits for it. Waiting with `wait` lets a signal reach our trap at once (bash defers
# traps while a foreground child runs), and the trap then stops CMD's whole group, so no helper
# of CMD (services.sh, initdb, ...) outlives us. --out sends CMD's stdout to FILE, --all stdout
# and stderr. (The redirection must be on CMD, not on the function call, or the trap's own
# messages would land in FILE too.)
run_child() {
    local rc=0 mode=none file=""
    case "$1" in
        --out | --all) mode=$1 file=$2; shift 2 ;;
    esac
    case "$mode" in
        none) setsid -w "$@" </dev/null & ;;
        --out) setsid -w "$@" >"$file" </dev/null & ;;
        --all) setsid -w "$@" >"$file" 2>&1 </dev/null & ;;
    esac
    CHILD=$!
    wait "$CHILD" || rc=$?
    CHILD=""
    return "$rc"
}

cluster_down() { # DIR
    local dir=$1
    CLUSTER_DIR="$dir" CLUSTER_STOP_TIMEOUT=15 "$OPS_DIR/cluster.sh" down >>"$dir.down.log" 2>&1 \
        || warn "ops/cluster.sh down for $dir failed (see $dir.down.log)"
}

# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [[ -n "$CHILD" ]]; then
        # The child's own process group (run_child starts it with setsid).
        kill -TERM -- "-$CHILD" 2>/dev/null || kill -TERM "$CHILD" 2>/dev/null || true
        wait "$CHILD" 2>/dev/null || true
    fi
    local dir
    for dir in "${ACTIVE_DIRS[@]}"; do
        [[ -n "$dir" ]] || continue
        info "stopping the cluster in ${dir#"$REPO_ROOT"/}"
        cluster_down "$dir"
    done
    exit "$rc"
}
trap cleanup EXIT
trap 'err "interrupted"; exit 130' INT
trap 'err "terminated"; exit 143' TERM

# --- build ---------------------------------------------------------------------------------------

step "packages"
ensure_packages postgresql redis curl jq
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

# --- scenarios -----------------------------------------------------------------------------------

START=$SECONDS
FAILED=0

# scenario_setup NAME: prints "allocators routers batch_max description".
scenario_setup() {
    case "$1" in
        baseline) echo "1 0 1 1 allocator, ALLOCATOR_BATCH_MAX=1" ;;
        batching) echo "1 0 $BATCH_MAX 1 allocator, ALLOCATOR_BATCH_MAX=$BATCH_MAX" ;;
        cluster) echo "3 2 $BATCH_MAX 3 allocators + 2 routers, ALLOCATOR_BATCH_MAX=$BATCH_MAX, via router-1" ;;
    esac
}

PG_SETTINGS="(settings unknown)"

# pg_settings DIR: the scenario PostgreSQL's commit durability, read-only.
pg_settings() {
    local url pg_bin
    # shellcheck disable=SC1091
    url="$(source "$1/env" && echo "$DATABASE_URL ${CLUSTER_PG_MODE:-?}")" || return 1
    pg_bin="$(pg_bin_dir)" || return 1
    printf '%s PostgreSQL with %s\n' "${url##* }" "$("$pg_bin/psql" -X -At "${url% *}" \
        -c "SELECT 'fsync=' || current_setting('fsync') || ' synchronous_commit=' || current_setting('synchronous_commit')" 2>/dev/null)"
}

# Rough wall time of one scenario beyond the load itself: initdb + start + map (~15 s), seed,
# final checks and stop.
OVERHEAD=45

run_scenario() {
    local name=$1 allocs routers batch desc dir target rc
    read -r allocs routers batch desc <<<"$(scenario_setup "$name")"
    dir="$BENCH_DIR/$name"
    rm -f "$dir".*.log "$dir.txt" "$dir.json"

    local elapsed=$((SECONDS - START))
    if ((elapsed + DURATION + OVERHEAD > BUDGET)); then
        warn "skipping scenario $name: ${elapsed}s used, it needs ~$((DURATION + OVERHEAD))s, budget ${BUDGET}s (BENCH_BUDGET_SECONDS)"
        printf '%s\tskipped\t%s\n' "$name" "$desc" >>"$RESULTS"
        return 0
    fi

    step "scenario $name: $desc"
    ACTIVE_DIRS+=("$dir")
    info "fresh private PostgreSQL + Redis, migrate ($PARTITIONS partitions), start (log ${dir#"$REPO_ROOT"/}.up.log)"
    if ! run_child --all "$dir.up.log" env CLUSTER_DIR="$dir" CLUSTER_PRIVATE="$PRIVATE" CLUSTER_SKIP_BUILD=1 \
        CLUSTER_ALLOCATORS="$allocs" CLUSTER_ROUTERS="$routers" CLUSTER_PARTITIONS="$PARTITIONS" \
        CLUSTER_READY_TIMEOUT=60 CLUSTER_MAP_TIMEOUT=30 ALLOCATOR_BATCH_MAX="$batch" \
        "$OPS_DIR/cluster.sh" up; then
        err "cluster up failed for $name; last lines of $dir.up.log:"
        tail -n 25 "$dir.up.log" >&2 || true
        printf '%s\tfailed\t%s\n' "$name" "$desc" >>"$RESULTS"
        FAILED=1
        cluster_down "$dir"
        ACTIVE_DIRS=("${ACTIVE_DIRS[@]/$dir/}")
        return 0
    fi
    # shellcheck disable=SC1091
    target="$(source "$dir/cluster.env" && if [[ -n "${ROUTER_URL:-}" ]]; then echo "$ROUTER_URL"; else echo "${ALLOCATOR_URLS%% *}"; fi)"
    [[ -n "$target" ]] || die "no URL in $dir/cluster.env"
    info "target $target"
    PG_SETTINGS="$(pg_settings "$dir")" || PG_SETTINGS="(settings unknown)"

    rc=0
    info "seeding $SKUS SKUs with $STOCK units each"
    run_child --all "$dir.seed.log" "$LOADTEST" seed --target "$target" --skus "$SKUS" --stock "$STOCK" \
        --prefix "$PREFIX" || rc=$?
    cat "$dir.seed.log" >&2
    if ((rc == 0)); then
        info "load: $CONCURRENCY workers, ${DURATION}s, skew $SKEW"
        # The report goes to $dir.txt (shown below); progress lines go to our stderr.
        run_child --out "$dir.txt" "$LOADTEST" run --target "$target" --skus "$SKUS" --prefix "$PREFIX" \
            --concurrency "$CONCURRENCY" --duration-secs "$DURATION" --skew "$SKEW" \
            --quantity "$QUANTITY" --confirm-ratio "$CONFIRM_RATIO" --release-ratio "$RELEASE_RATIO" \
            --seed "$SEED" --json-out "$dir.json" || rc=$?
        cat "$dir.txt" >&2
    fi
    if [[ -s "$dir.json" ]] && ((rc == 0 || rc == 1)); then
        jq -r --arg n "$name" --arg d "$desc" '[$n, "ran", $d,
            .reserves_per_sec, .http_requests_per_sec,
            .ops.reserve.latency.p50_ms, .ops.reserve.latency.p99_ms, .ops.reserve.latency.p999_ms,
            ([.retries_by_cause[]] | add // 0),
            ([.ops.reserve.outcomes | to_entries[] | select(.key | startswith("gave_up")) | .value] | add // 0),
            (if .invariants.ok then "OK" else "FAILED" end)] | @tsv' "$dir.json" >>"$RESULTS"
        ((rc == 0)) || FAILED=1
    else
        err "scenario $name: loadtest failed (exit $rc)"
        printf '%s\tfailed\t%s\n' "$name" "$desc" >>"$RESULTS"
        FAILED=1
    fi

    info "stopping $name"
    cluster_down "$dir"
    ACTIVE_DIRS=("${ACTIVE_DIRS[@]/$dir/}")
}

step "benchmark: $SKEW over $SKUS SKUs, $CONCURRENCY workers, ${DURATION}s per scenario; scenarios: $SCENARIOS"
for s in $SCENARIOS; do
    run_scenario "$s"
done

# --- table ---------------------------------------------------------------------------------------

echo
echo "hot-SKU benchmark: skew $SKEW over $SKUS SKUs, $CONCURRENCY closed-loop workers, ${DURATION}s per scenario,"
echo "reserve then confirm $CONFIRM_RATIO / release $RELEASE_RATIO, $PARTITIONS partitions, $(nproc 2>/dev/null || echo '?') CPUs,"
echo "a fresh $PG_SETTINGS per scenario"
echo
awk -F'\t' '
    BEGIN {
        printf "%-9s %10s %9s %9s %9s %10s %8s %8s %-10s  %s\n", "scenario", "reserves/s", "req/s", "p50 ms", "p99 ms", "p99.9 ms", "retries", "gave up", "invariants", "setup"
    }
    $2 != "ran" { printf "%-9s %10s %9s %9s %9s %10s %8s %8s %-10s  %s\n", $1, $2, "-", "-", "-", "-", "-", "-", "-", $3; next }
    {
        printf "%-9s %10.1f %9.1f %9.2f %9.2f %10.2f %8d %8d %-10s  %s\n", $1, $4, $5, $6, $7, $8, $9, $10, $11, $3
        tput[$1] = $4; p99[$1] = $7; order[++n] = $1
    }
    END {
        if (!("baseline" in tput) || tput["baseline"] <= 0) exit
        print ""
        for (i = 1; i <= n; i++) {
            s = order[i]
            if (s == "baseline") continue
            printf "%s: %.1fx baseline throughput, p99 %.2fx baseline (%.2f ms vs %.2f ms)\n", s, tput[s] / tput["baseline"], (p99["baseline"] > 0 ? p99[s] / p99["baseline"] : 0), p99[s], p99["baseline"]
        }
    }' "$RESULTS"
echo
echo "(reserves/s: reserve operations completed per second; latency: reserve end to end, retries included."
echo " Reports: ${BENCH_DIR#"$REPO_ROOT"/}/<scenario>.txt and .json; process logs: ${BENCH_DIR#"$REPO_ROOT"/}/<scenario>/logs/)"
info "benchmark done in $((SECONDS - START))s (build excluded)"
exit "$FAILED"
