#!/usr/bin/env bash
# What one fenced reserve costs, side by side: the allocator's fenced batch statement candidates
# against pgbench's naive fenced single-statement reserve, in one invocation on one private,
# durable PostgreSQL (fsync and synchronous commit on) with pg_stat_statements.
#
#   ops/bench/fenced-cost.sh           build release binaries, run every row, print a Markdown table
#   ops/bench/fenced-cost.sh --help
#
# Rows, one after the other, each COST_DURATION seconds:
#   pgbench naive     ops/bench/naive_reserve_{uniform,hot}.sql over COST_SKUS rows / one row,
#                     COST_CONCURRENCY clients, and uniform with one client; then open loop (-R) at the rate of the first
#                     candidate's 25 % row, latency from the schedule
#   each candidate    an allocator started with the candidate's flags (COST_CANDIDATES), then
#                     `loadtest run` straight to it, reserve only: closed loop uniform over
#                     COST_SKUS SKUs and on one hot SKU with COST_CONCURRENCY clients; then, restarted,
#                     closed loop uniform with one client (a lone command at a time), and open loop
#                     uniform at each of COST_OPEN_FRACTIONS ("0.25 0.5") of the FIRST candidate's
#                     closed-loop uniform rate, so every candidate and pgbench -R (the last rows)
#                     see the same offered rates
# Every row reports operations per second, p50/p99 latency (ms), CPU per operation (µs, from
# /proc: the PostgreSQL postmaster and every backend, live or exited; the allocator; the load
# generator) and the top statements of pg_stat_statements (calls, mean execution time, rows per
# call), reset before each row. Ratios: hot rows against pgbench hot, uniform rows against
# pgbench uniform (throughput), CPU against pgbench's PostgreSQL CPU per transaction; open-loop
# rows: p50 and p99 against pgbench -R at the same rate; 1-client rows: throughput, p50 and p99
# against pgbench with one client.
#
# Knobs (environment): COST_DURATION (10), COST_CONCURRENCY (64), COST_SKUS (10000),
# COST_PARTITIONS (16), COST_OPEN_FRACTIONS ("0.25 0.5"), COST_DIR (.cluster/cost),
# COST_SKIP_BUILD=1, COST_TOKEN_FILE (a bearer token for candidates started with --auth-file: the
# load generator and the readiness check send it; it needs the reserve and admin scopes),
# COST_CANDIDATES (name=flags pairs separated by ';'; default
# "set=--set-based-reserves=true;function=--set-based-reserves=false;set-2-lanes=--commit-lanes 2").
# A candidate's flags may start with bin=PATH: that allocator binary instead of the build's, for an
# A/B of two builds in one invocation, e.g.
# COST_CANDIDATES="before=bin=/tmp/old/allocator;after=" ops/bench/fenced-cost.sh
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

only_help_flag "${BASH_SOURCE[0]}" "$@"

DURATION="${COST_DURATION:-10}"
CONCURRENCY="${COST_CONCURRENCY:-64}"
SKUS="${COST_SKUS:-10000}"
PARTITIONS="${COST_PARTITIONS:-16}"
OPEN_FRACTIONS="${COST_OPEN_FRACTIONS:-${COST_OPEN_FRACTION:-0.25 0.5}}"
CANDIDATES="${COST_CANDIDATES:-set=--set-based-reserves=true;function=--set-based-reserves=false;set-2-lanes=--commit-lanes 2}"
DIR="${COST_DIR:-$REPO_ROOT/.cluster/cost}"
LOADTEST_EXTRA=()
if [[ -n "${COST_TOKEN_FILE:-}" ]]; then
    [[ -r "$COST_TOKEN_FILE" ]] || die "COST_TOKEN_FILE $COST_TOKEN_FILE is not readable"
    LOADTEST_EXTRA=(--token-file "$COST_TOKEN_FILE")
    export BENCH_TOKEN_FILE="$COST_TOKEN_FILE"
fi
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
LOADTEST="$TARGET_DIR/release/loadtest"
ALLOCATOR="$TARGET_DIR/release/allocator"
STOCK=1000000000
TICK="$(getconf CLK_TCK)"

for v in DURATION CONCURRENCY SKUS PARTITIONS; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "COST_$v must be a positive integer, got '${!v}'"
done

# shellcheck source=ops/bench/lib.sh
source "$OPS_DIR/bench/lib.sh"

ensure_packages postgresql curl jq
PG_BIN="$(pg_bin_dir)" || die "no PostgreSQL server binaries"
PGBENCH="$(command -v pgbench || echo "$PG_BIN/pgbench")"
if [[ -z "${COST_SKIP_BUILD:-}" ]]; then
    step "cargo build --release -p allocator -p loadtest"
    (cd "$REPO_ROOT" && cargo build --release -p allocator -p loadtest) || die "build failed"
fi
mkdir -p "$DIR"
rm -f "$DIR"/row* "$DIR/table.md"

step "private durable PostgreSQL with pg_stat_statements"
bench_services_up allocator_cost \
    "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=top -c pg_stat_statements.track_planning=on -c max_connections=300"
POSTMASTER="$(head -n 1 "$CLUSTER_DIR/run/postgres.pid")"
"$ALLOCATOR" migrate --database-url "$DATABASE_URL" --partitions "$PARTITIONS" >"$DIR/migrate.log" 2>&1
psql_db "$DATABASE_URL" -c "CREATE EXTENSION pg_stat_statements"
seed() {
    "$LOADTEST" partitions --prefix "$1" --skus "$2" --partitions "$PARTITIONS" \
        | psql_db "$DATABASE_URL" -v stock="$STOCK" -f "$OPS_DIR/bench/seed.sql" >/dev/null
}
NAIVE_URL="postgres://postgres@127.0.0.1:$PG_PORT/allocator_naive"
"$PG_BIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres allocator_naive
psql_db "$NAIVE_URL" -v partitions="$PARTITIONS" -v stock="$STOCK" -v skus="$SKUS" -f "$OPS_DIR/bench/naive_init.sql"
psql_db "$NAIVE_URL" -c "CREATE EXTENSION pg_stat_statements"

# ticks PID: utime + stime of PID; with "tree", also of its exited, waited-for children and of its
# live children (PostgreSQL backends).
ticks() {
    local pid=$1 tree=${2:-} total
    total="$(awk '{ print $14 + $15 + ("'"$tree"'" == "tree" ? $16 + $17 : 0) }' "/proc/$pid/stat" 2>/dev/null)"
    [[ -n "$total" ]] || return 1
    if [[ $tree == tree ]]; then
        for child in $(pgrep -P "$pid"); do
            total=$((total + $(awk '{ print $14 + $15 }' "/proc/$child/stat" 2>/dev/null || echo 0)))
        done
    fi
    echo "$total"
}
us_per_op() { awk -v t="$1" -v n="$2" -v k="$TICK" 'BEGIN { printf "%.0f", (n > 0 ? t * 1e6 / k / n : 0) }'; }
# statements URL NAME: the row's top statements from pg_stat_statements, one Markdown line each.
statements() {
    psql_db -At -F $'\t' "$1" -c "SELECT calls, round(mean_exec_time::numeric, 3), round(rows::numeric / greatest(calls, 1), 1),
           plans,
           left(regexp_replace(query, '\s+', ' ', 'g'), 70)
      FROM pg_stat_statements WHERE calls > 10 AND query !~* 'pg_stat_statements'
     ORDER BY total_exec_time DESC LIMIT 3" \
        | awk -F '\t' -v row="$2" '{ printf "| %s | %s | %s | %s | %s | `%s` |\n", row, $1, $2, $3, $4, $5 }' >>"$DIR/statements.md"
}
file_name() { printf '%s' "$1" | tr -c 'A-Za-z0-9_' '_'; }
reset_statements() { psql_db -At "$1" -c "SELECT pg_stat_statements_reset()" >/dev/null; }
# record NAME OPS P50 P99 PG_TICKS SERVICE_TICKS GEN_TICKS COUNT
record() {
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$(us_per_op "$5" "$8")" \
        "$([[ $6 == - ]] && echo - || us_per_op "$6" "$8")" "$(us_per_op "$7" "$8")" >>"$DIR/rows.tsv"
}
: >"$DIR/rows.tsv"
: >"$DIR/statements.md"

# pgbench_row NAME SCRIPT [RATE]
pgbench_row() {
    local name=$1 script=$2 rate=${3:-} prefix pg0 pg1 count p50 p99
    prefix="$DIR/row_$(file_name "$1")"
    info "$name"
    reset_statements "$NAIVE_URL"
    rm -f "$prefix".*
    pg0="$(ticks "$POSTMASTER" tree)"
    /usr/bin/time -f '%U %S' -o "$prefix.time" "$PGBENCH" -n -M prepared -c "${CLIENTS:-$CONCURRENCY}" -j "$(((${CLIENTS:-$CONCURRENCY} > 1) + 1))" -T "$DURATION" -D skus="$SKUS" \
        ${rate:+-R "$rate"} -f "$OPS_DIR/bench/$script" -l --log-prefix="$prefix" "$NAIVE_URL" >"$prefix.txt" 2>&1
    # The backends exit with pgbench; their CPU counts once the postmaster has reaped them.
    sleep 0.5
    pg1="$(ticks "$POSTMASTER" tree)"
    cat "$prefix".[0-9]* | awk '{ print $3 + ($7 == "" ? 0 : $7) }' | sort -n >"$prefix.us"
    count="$(wc -l <"$prefix.us")"
    read -r p50 p99 <<<"$(awk '{ v[NR] = $1 } END { printf "%.2f %.2f", v[int(NR * 0.5 + 0.999)] / 1000, v[int(NR * 0.99 + 0.999)] / 1000 }' "$prefix.us")"
    read -r u s <"$prefix.time"
    record "$name" "$(awk -v n="$count" -v d="$DURATION" 'BEGIN { printf "%.0f", n / d }')" "$p50" "$p99" \
        $((pg1 - pg0)) - "$(awk -v u="$u" -v s="$s" -v k="$TICK" 'BEGIN { printf "%.0f", (u + s) * k }')" "$count"
    statements "$NAIVE_URL" "$name"
}

# loadtest_row NAME URL PREFIX SKUS SKEW [EXTRA...]
loadtest_row() {
    local name=$1 url=$2 prefix=$3 skus=$4 skew=$5 out pg0 pg1 a0 a1 g0 g1 count
    out="$DIR/row_$(file_name "$1")"
    shift 5
    info "$name"
    reset_statements "$DATABASE_URL"
    # CPU is sampled over the load phase only (the run's DURATION seconds from its start), not
    # over loadtest's invariant checks afterwards, which read every SKU back.
    /usr/bin/time -f '%U %S' -o "$out.time" "$LOADTEST" run --target "$url" --skus "$skus" --prefix "$prefix" \
        --skew "$skew" --duration-secs "$DURATION" --confirm-ratio 0 --release-ratio 0 --snapshot-max 0 \
        --progress-secs 0 --seed 42 --json-out "$out.json" "${LOADTEST_EXTRA[@]}" "$@" >"$out.txt" 2>"$out.err" &
    local lt=$!
    sleep 0.1
    # The load generator runs under time(1): its own CPU is read from its child.
    local gen
    gen="$(pgrep -P "$lt" | head -n 1)"
    pg0="$(ticks "$POSTMASTER" tree)"; a0="$(ticks "$ALLOC_PID")"; g0="$(ticks "$gen" || echo 0)"
    sleep "$DURATION"
    pg1="$(ticks "$POSTMASTER" tree)"; a1="$(ticks "$ALLOC_PID")"; g1="$(ticks "$gen" || echo)"
    wait "$lt" || true
    if [[ -z "$g1" ]]; then # it finished early: all of its CPU, checks included
        read -r u s <"$out.time"
        g1="$(awk -v u="$u" -v s="$s" -v k="$TICK" 'BEGIN { printf "%.0f", (u + s) * k }')"
    fi
    [[ -s "$out.json" ]] || die "$name: loadtest failed: $(tail -n 3 "$out.err")"
    count="$(jq '.ops.reserve.latency.count' "$out.json")"
    record "$name" "$(jq '.reserves_per_sec | floor' "$out.json")" "$(jq '.ops.reserve.latency.p50_ms' "$out.json")" \
        "$(jq '.ops.reserve.latency.p99_ms' "$out.json")" $((pg1 - pg0)) $((a1 - a0)) $((g1 - g0)) "$count"
    statements "$DATABASE_URL" "$name"
    jq -e '.invariants.ok' "$out.json" >/dev/null || die "$name: invariant checks failed"
}

step "pgbench: naive fenced single-statement reserve"
pgbench_row "naive uniform" naive_reserve_uniform.sql
pgbench_row "naive hot" naive_reserve_hot.sql
CLIENTS=1 pgbench_row "naive uniform, 1 client" naive_reserve_uniform.sql

# start_allocator NAME BIN FLAGS...: one allocator owning every partition; sets ALLOC_PID and url.
start_allocator() {
    local name=$1 bin=$2
    shift 2
    bench_start_allocator "$bin" "$DATABASE_URL" "cost-$name" "$@"
    url="$ALLOC_URL"
}

OPEN_RATES=""
IFS=';' read -r -a CANDIDATE_LIST <<<"$CANDIDATES"
for candidate in "${CANDIDATE_LIST[@]}"; do
    name="${candidate%%=*}"
    read -r -a flags <<<"${candidate#*=}"
    bin="$ALLOCATOR"
    if [[ "${flags[0]:-}" == bin=* ]]; then
        bin="${flags[0]#bin=}"
        flags=("${flags[@]:1}")
        [[ -x "$bin" ]] || die "candidate $name: no allocator binary $bin"
    fi
    step "candidate $name: $bin ${flags[*]}"
    start_allocator "$name" "$bin" "${flags[@]}"
    # Fresh SKUs for every row: loadtest's checks account from the seeded state.
    seed "u$name" "$SKUS"
    seed "h$name" 1
    loadtest_row "$name uniform" "$url" "u$name" "$SKUS" uniform --concurrency "$CONCURRENCY"
    loadtest_row "$name hot" "$url" "h$name" 1 uniform --concurrency "$CONCURRENCY"
    if [[ -z "$OPEN_RATES" ]]; then
        peak="$(awk -F '\t' -v r="$name uniform" '$1 == r { print $2 }' "$DIR/rows.tsv")"
        for fraction in $OPEN_FRACTIONS; do
            OPEN_RATES+="$(awk -v p="$peak" -v f="$fraction" 'BEGIN { printf "%.0f", p * f }') "
        done
    fi
    # The open-loop rows on a freshly started allocator, as at ordinary load after a start: its
    # connections have seen only small groups (PostgreSQL's plan cache decides per connection).
    bench_stop_allocator
    start_allocator "$name" "$bin" "${flags[@]}"
    seed "l$name" "$SKUS"
    loadtest_row "$name uniform, 1 client" "$url" "l$name" "$SKUS" uniform --concurrency 1
    for rate in $OPEN_RATES; do
        seed "o$name$rate" "$SKUS"
        loadtest_row "$name uniform ${rate}/s" "$url" "o$name$rate" "$SKUS" uniform --rate "$rate" --max-in-flight 256
    done
    bench_stop_allocator
done
for rate in $OPEN_RATES; do
    pgbench_row "naive uniform ${rate}/s" naive_reserve_uniform.sql "$rate"
done

# --- table ---------------------------------------------------------------------------------------
{
    echo "| row | ops/s | p50 ms | p99 ms | PostgreSQL CPU µs/op | allocator CPU µs/op | load generator CPU µs/op | vs naive (throughput or open-loop p50/p99 at the same rate; PostgreSQL CPU) |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    awk -F '\t' '
        $1 == "naive uniform" { nu = $2; ncpu = $5 } $1 == "naive hot" { nh = $2 }
        $1 == "naive uniform, 1 client" { n1 = $2; n1cpu = $5; n150 = $3; n199 = $4 }
        $1 ~ /^naive uniform .*\/s$/ { rate = $1; sub(/.* /, "", rate); n50[rate] = $3; n99[rate] = $4 }
        { r[NR] = $0 }
        END { for (i = 1; i <= NR; i++) { split(r[i], f, "\t");
            base = (f[1] ~ /hot/ ? nh : nu)
            ratio = (f[1] ~ /^naive/ ? "1.00x" : sprintf("%.2fx; %.2fx", f[2] / base, f[5] / ncpu))
            if (f[1] ~ /1 client$/ && f[1] !~ /^naive/)
                ratio = sprintf("%.2fx, p50 %.2fx, p99 %.2fx; %s", f[2] / n1, f[3] / n150, f[4] / n199, (n1cpu > 0 ? sprintf("%.2fx", f[5] / n1cpu) : "-"))
            if (f[1] ~ /\/s$/) { rate = f[1]; sub(/.* /, "", rate)
                ratio = sprintf("p50 %.2fx, p99 %.2fx; %.2fx", f[3] / n50[rate], f[4] / n99[rate], f[5] / ncpu) }
            printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", f[1], f[2], f[3], f[4], f[5], f[6], f[7], ratio } }' "$DIR/rows.tsv"
    echo
    echo "Top statements per row (pg_stat_statements, reset before each row):"
    echo
    echo "| row | calls | mean ms | rows/call | plans | statement |"
    echo "| --- | ---: | ---: | ---: | ---: | --- |"
    cat "$DIR/statements.md"
} | tee "$DIR/table.md"
