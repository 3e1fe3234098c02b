#!/usr/bin/env bash
# Does the cost of a reserve grow with history? Two figures from one invocation on one private,
# durable PostgreSQL (fsync and synchronous commit on, shared_buffers GROWTH_SHARED_BUFFERS):
#
#   1. growth: closed-loop uniform reserves (`loadtest run`, GROWTH_CONCURRENCY clients, fresh
#      SKUs) straight to one allocator, on an empty database and on one holding GROWTH_HISTORY
#      historical reservations (random UUID ids, as clients send, all four terminal states,
#      changed within the last day so inside the default horizon) and their ledger rows (two
#      each), both in the same server; GROWTH_ROUNDS rounds alternate them (empty, grown,
#      empty, grown, ...) so a machine whose load drifts weighs on both alike; prints every
#      round's rates and ratio, and the median ratio with the spread of the rounds.
#   2. steady: a fresh database whose ledger is partitioned by GROWTH_PARTITION_SPAN_SECS, an
#      allocator with --idempotency-horizon-secs GROWTH_HORIZON_SECS, settlement windows of
#      GROWTH_WINDOW_SECS and (GROWTH_ARCHIVE=1) --ledger-archive-dir, open-loop reserves at
#      GROWTH_STEADY_RATE per second (half confirmed, the rest released or expired after a 5 s
#      hold) for GROWTH_STEADY_SECS; every 10 s the sizes of `reservations` (heap, indexes,
#      TOAST), its live rows, the ledger (all partitions), its partitions, the archived ones and
#      the database. Once the horizon has passed, removals keep pace with inserts, vacuum makes
#      their space reusable and the retention job archives and drops each ledger partition as
#      it passes the horizon and settles: prints each size at the start of the run's last third
#      against the size at the end. With GROWTH_ARCHIVE=0 the ledger is kept and the database
#      grows by its rows.
#   Under the figures: for each growth row, the hot tables' (inventory, leases, reservations)
#   inserts, updates, HOT updates, live and dead tuples and autovacuum runs over the row, from
#   pg_stat_user_tables (reset before the row), with their storage options.
#
#   ops/bench.sh growth       (or ops/bench/growth.sh) build release binaries, run both, print
#   ops/bench/growth.sh --help
#
# The history loader reports its speed (reservations and ledger rows per second, and what that
# makes of a 50-million-row load) in the table and in $GROWTH_DIR/load.txt.
#
# Knobs (environment): GROWTH_HISTORY (2000000; the full run is 50000000, about 30 GB), GROWTH_DURATION
# (15 s per growth row), GROWTH_ROUNDS (3), GROWTH_CONCURRENCY (64), GROWTH_SKUS (10000), GROWTH_PARTITIONS (16),
# GROWTH_SHARED_BUFFERS (256MB), GROWTH_HORIZON_SECS (20), GROWTH_STEADY_SECS (180),
# GROWTH_STEADY_RATE (500), GROWTH_PARTITION_SPAN_SECS (10), GROWTH_WINDOW_SECS (5),
# GROWTH_ARCHIVE (1), GROWTH_DIR (.cluster/growth), GROWTH_SKIP_BUILD=1.
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

only_help_flag "${BASH_SOURCE[0]}" "$@"

HISTORY="${GROWTH_HISTORY:-2000000}"
DURATION="${GROWTH_DURATION:-15}"
ROUNDS="${GROWTH_ROUNDS:-3}"
CONCURRENCY="${GROWTH_CONCURRENCY:-64}"
SKUS="${GROWTH_SKUS:-10000}"
PARTITIONS="${GROWTH_PARTITIONS:-16}"
SHARED_BUFFERS="${GROWTH_SHARED_BUFFERS:-256MB}"
HORIZON="${GROWTH_HORIZON_SECS:-20}"
STEADY_SECS="${GROWTH_STEADY_SECS:-180}"
STEADY_RATE="${GROWTH_STEADY_RATE:-500}"
SPAN="${GROWTH_PARTITION_SPAN_SECS:-10}"
WINDOW="${GROWTH_WINDOW_SECS:-5}"
ARCHIVE="${GROWTH_ARCHIVE:-1}"
DIR="${GROWTH_DIR:-$REPO_ROOT/.cluster/growth}"
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
LOADTEST="$TARGET_DIR/release/loadtest"
ALLOCATOR="$TARGET_DIR/release/allocator"
STOCK=1000000000
CHUNK=500000

[[ "$ARCHIVE" == 0 || "$ARCHIVE" == 1 ]] || die "GROWTH_ARCHIVE must be 0 or 1, got '$ARCHIVE'"
for v in HISTORY DURATION ROUNDS CONCURRENCY SKUS PARTITIONS HORIZON STEADY_SECS STEADY_RATE SPAN WINDOW; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "GROWTH_$v must be a positive integer, got '${!v}'"
done
((STEADY_SECS >= 3 * HORIZON)) || die "GROWTH_STEADY_SECS must be at least 3 x GROWTH_HORIZON_SECS"
((STEADY_SECS >= 60)) || die "GROWTH_STEADY_SECS must be at least 60 (with the default 60 s autovacuum naptime, 180 shows the plateau)"

# shellcheck source=ops/bench/lib.sh
source "$OPS_DIR/bench/lib.sh"

ensure_packages postgresql curl jq
PG_BIN="$(pg_bin_dir)" || die "no PostgreSQL server binaries"
if [[ -z "${GROWTH_SKIP_BUILD:-}" ]]; then
    step "cargo build --release -p allocator -p loadtest"
    (cd "$REPO_ROOT" && cargo build --release -p allocator -p loadtest) || die "build failed"
fi
mkdir -p "$DIR"
rm -rf "$DIR"/row* "$DIR/steady.tsv" "$DIR/health.md" "$DIR/load.txt" "$DIR/archive"

step "private durable PostgreSQL, shared_buffers=$SHARED_BUFFERS"
bench_services_up allocator_growth "-c shared_buffers=$SHARED_BUFFERS -c max_connections=300"
STEADY_URL="postgres://postgres@127.0.0.1:$PG_PORT/allocator_steady"
EMPTY_URL="postgres://postgres@127.0.0.1:$PG_PORT/allocator_empty"

# start_allocator URL NAME FLAGS...: one replica owning every partition of URL's cluster
# (migrated with MIGRATE_FLAGS, an array, if set).
MIGRATE_FLAGS=()
start_allocator() {
    local url=$1 name=$2
    shift 2
    "$ALLOCATOR" migrate --database-url "$url" --partitions "$PARTITIONS" "${MIGRATE_FLAGS[@]}" \
        >>"$DIR/migrate.log" 2>&1
    bench_start_allocator "$ALLOCATOR" "$url" "growth-$name" "$@"
}
seed() {
    "$LOADTEST" partitions --prefix "$2" --skus "$SKUS" --partitions "$PARTITIONS" \
        | psql_db "$1" -v stock="$STOCK" -f "$OPS_DIR/bench/seed.sql" >/dev/null
}
# growth_row NAME PREFIX URL: closed-loop uniform reserves on fresh SKUs of URL's database, served
# by an allocator started for the row; sets RATE (reserves/s).
growth_row() {
    local out="$DIR/row_$1"
    start_allocator "$3" growth
    seed "$3" "$2"
    psql_db -At "$3" -c "SELECT pg_stat_reset()" >/dev/null
    "$LOADTEST" run --target "$ALLOC_URL" --skus "$SKUS" --prefix "$2" --skew uniform \
        --concurrency "$CONCURRENCY" --duration-secs "$DURATION" --confirm-ratio 0 --release-ratio 0 \
        --snapshot-max 0 --progress-secs 0 --seed 42 --json-out "$out.json" >"$out.txt" 2>"$out.err" \
        || die "$1: loadtest failed: $(tail -n 3 "$out.err")"
    jq -e '.invariants.ok' "$out.json" >/dev/null || die "$1: invariant checks failed"
    health "$1" "$3"
    bench_stop_allocator
    RATE="$(jq '.reserves_per_sec | floor' "$out.json")"
}
# load_history N: N terminal reservations with random UUID ids changed within the last day, and
# two ledger rows each (reserve, then confirm or release), on SKUs the load never uses.
load_history() {
    local done=0 n started=$SECONDS ledger_before
    ledger_before="$(psql_db -At "$DATABASE_URL" -c "SELECT count(*) FROM ledger")"
    while ((done < $1)); do
        n=$(($1 - done < CHUNK ? $1 - done : CHUNK))
        psql_db "$DATABASE_URL" -v n="$n" <<'SQL'
BEGIN;
CREATE TEMP TABLE h ON COMMIT DROP AS
SELECT gen_random_uuid()::text AS id, 'hist-' || (g % 10000) AS sku, g % 16 AS part,
       (ARRAY['confirmed', 'released', 'expired', 'rejected'])[1 + g % 4] AS status,
       now() - random() * interval '1 day' AS at
  FROM generate_series(1, :n) AS g;
INSERT INTO reservations (reservation_id, sku, partition, quantity, status, epoch, ttl_seconds,
                          request_fingerprint, created_at, updated_at)
SELECT id, sku, part, 1, status, 1, 900, sku || '/1/900', at, at FROM h;
-- Numbered after each partition's last position, as the fenced batch numbers its rows (the
-- counters raised first, so they are locked); unnumbered rows would be numbered one at a time.
CREATE TEMP TABLE hl ON COMMIT DROP AS
SELECT sku, part, 'reserve' AS kind, id, 0 AS d_on_hand, -1 AS d_available, 1 AS d_held,
       0 AS d_confirmed, at, 1 AS step
  FROM h WHERE status <> 'rejected'
UNION ALL
SELECT sku, part, CASE status WHEN 'confirmed' THEN 'confirm' WHEN 'released' THEN 'release'
                              ELSE 'expire' END,
       id, 0, CASE status WHEN 'confirmed' THEN 0 ELSE 1 END, -1,
       CASE status WHEN 'confirmed' THEN 1 ELSE 0 END, at, 2
  FROM h WHERE status <> 'rejected';
INSERT INTO ledger_positions (partition, last_position)
SELECT DISTINCT part, 0 FROM hl ON CONFLICT (partition) DO NOTHING;
WITH n AS (SELECT part, count(*) AS rows FROM hl GROUP BY part),
bump AS (
    UPDATE ledger_positions AS p SET last_position = p.last_position + n.rows
      FROM n WHERE p.partition = n.part
    RETURNING p.partition, p.last_position - n.rows AS base)
INSERT INTO ledger (sku, partition, kind, reservation_id, d_on_hand, d_available, d_held,
                    d_confirmed, epoch, recorded_at, position)
SELECT hl.sku, hl.part, hl.kind, hl.id, hl.d_on_hand, hl.d_available, hl.d_held, hl.d_confirmed,
       1, hl.at, bump.base + row_number() OVER (PARTITION BY hl.part ORDER BY hl.at, hl.id, hl.step)
  FROM hl JOIN bump ON bump.partition = hl.part;
COMMIT;
SQL
        done=$((done + n))
        info "history: $done / $1 ($((SECONDS - started)) s)"
    done
    local loaded=$((SECONDS - started))
    psql_db "$DATABASE_URL" -c "VACUUM ANALYZE reservations" -c "VACUUM ANALYZE ledger" -c "CHECKPOINT"
    local total=$((SECONDS - started)) ledger_rows
    ledger_rows="$(psql_db -At "$DATABASE_URL" -c "SELECT count(*) - $ledger_before FROM ledger")"
    # The 50-million estimate scales this run's rate; a larger load runs further out of memory.
    awk -v n="$1" -v l="$ledger_rows" -v s="$loaded" -v t="$total" 'BEGIN {
        s = s > 0 ? s : 1
        printf "history loader: %d reservations and %d ledger rows in %d s (%d s with VACUUM ANALYZE and CHECKPOINT): %.0f reservations/s, %.0f ledger rows/s; 50000000 reservations at this rate: about %.0f min\n",
            n, l, s, t, n / s, l / s, 50000000 / (n / s) / 60 * t / s
    }' | tee "$DIR/load.txt"
}
# health ROW URL: the hot tables' updates, HOT ratio and dead tuples since the row began (the
# database's statistics are reset before each growth row), one Markdown line each.
health() {
    sleep 1 # statistics reach the collector at the end of each transaction, within a second
    psql_db -At -F $'\t' "$2" -c "SELECT s.relname, n_tup_ins, n_tup_upd, n_tup_hot_upd,
            round(100.0 * n_tup_hot_upd / greatest(n_tup_upd, 1), 1), n_live_tup, n_dead_tup,
            autovacuum_count, coalesce(array_to_string(c.reloptions, ' '), 'defaults')
       FROM pg_stat_user_tables AS s JOIN pg_class AS c ON c.oid = s.relid
      WHERE s.relname IN ('inventory', 'leases', 'reservations') ORDER BY s.relname" \
        | awk -F '\t' -v row="$1" '{ printf "| %s | %s | %s | %s | %s | %s %% | %s | %s | %s | %s |\n", row, $1, $2, $3, $4, $5, $6, $7, $8, $9 }' >>"$DIR/health.md"
}
size_of() { psql_db -At "$1" -c "SELECT pg_size_pretty(pg_database_size(current_database()))"; }
# steady_sample: one line of steady.tsv (reservations, ledger over its partitions, the database).
steady_sample() {
    psql_db -At -F $'\t' "$STEADY_URL" -c "SELECT pg_total_relation_size('reservations'),
        (SELECT count(*) FROM reservations),
        (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'reservations'),
        (SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree('ledger')
          WHERE isleaf),
        (SELECT count(*) FROM ledger_partitions), (SELECT count(*) FROM ledger_archives),
        pg_database_size(current_database())"
}

step "growth: loading $HISTORY historical reservations and their ledger rows"
"$PG_BIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres allocator_empty
for url in "$EMPTY_URL" "$DATABASE_URL"; do
    "$ALLOCATOR" migrate --database-url "$url" --partitions "$PARTITIONS" >>"$DIR/migrate.log" 2>&1
done
load_history "$HISTORY"
HISTORY_SIZE="$(size_of "$DATABASE_URL")"
EMPTY=() LOADED=()
for ((round = 1; round <= ROUNDS; round++)); do
    step "growth round $round/$ROUNDS: uniform reserves, empty database, then $HISTORY reservations of history ($HISTORY_SIZE)"
    growth_row "empty-$round" "e$round" "$EMPTY_URL"
    EMPTY+=("$RATE")
    growth_row "history-$round" "h$round" "$DATABASE_URL"
    LOADED+=("$RATE")
    info "round $round: empty ${EMPTY[-1]} reserves/s, history ${LOADED[-1]} reserves/s"
done

step "steady: horizon ${HORIZON}s, ledger partitions of ${SPAN}s (archival $([[ $ARCHIVE == 1 ]] && echo on || echo off)), $STEADY_RATE reserves/s for ${STEADY_SECS}s"
"$PG_BIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres allocator_steady
MIGRATE_FLAGS=(--ledger-partition-span-secs "$SPAN")
STEADY_FLAGS=(--idempotency-horizon-secs "$HORIZON" --settlement-window-secs "$WINDOW")
[[ "$ARCHIVE" == 1 ]] && STEADY_FLAGS+=(--ledger-archive-dir "$DIR/archive")
start_allocator "$STEADY_URL" steady "${STEADY_FLAGS[@]}"
seed "$STEADY_URL" s
"$LOADTEST" run --target "$ALLOC_URL" --skus "$SKUS" --prefix s --skew uniform --rate "$STEADY_RATE" \
    --duration-secs "$STEADY_SECS" --confirm-ratio 0.5 --release-ratio 0.3 --ttl-seconds 5 \
    --snapshot-max 0 --progress-secs 0 --seed 7 --json-out "$DIR/row_steady.json" \
    >"$DIR/row_steady.txt" 2>"$DIR/row_steady.err" &
LOAD_PID=$!
printf 'second\treservations_bytes\treservations_live\treservations_dead\tledger_bytes\tledger_partitions\tarchived_partitions\tdatabase_bytes\n' >"$DIR/steady.tsv"
for ((t = 10; t <= STEADY_SECS; t += 10)); do
    sleep 10
    printf '%s\t%s\n' "$t" "$(steady_sample)" >>"$DIR/steady.tsv"
done
# loadtest reads its holds back at the end and expects every id to be kept; a horizon shorter
# than the run removes them by design, so only its failing to run at all counts here.
wait "$LOAD_PID" || true
[[ -s "$DIR/row_steady.json" ]] || die "steady load failed: $(tail -n 3 "$DIR/row_steady.err")"
REMOVED="$(curl -fsS "$ALLOC_URL/metrics" | awk '/^allocator_retention_removed_total\{table="reservations"\}/ { print $2 }')"
bench_stop_allocator

# --- report --------------------------------------------------------------------------------------
{
    echo "| run | figure |"
    echo "| --- | --- |"
    for ((i = 0; i < ROUNDS; i++)); do
        awk -v r="$((i + 1))" -v e="${EMPTY[i]}" -v h="${LOADED[i]}" -v n="$HISTORY" -v size="$HISTORY_SIZE" \
            'BEGIN { printf "| round %d: uniform reserves/s, empty / %d reservations of history (%s) | %d / %d = %.2fx |\n", r, n, size, e, h, h / e }'
    done
    # The median ratio of the rounds, and their spread (lowest and highest).
    for ((i = 0; i < ROUNDS; i++)); do echo "${LOADED[i]} ${EMPTY[i]}"; done | awk '{ print $1 / $2 }' | sort -g \
        | awk '{ r[NR] = $1 } END { m = NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2
            printf "| history / empty, median of %d alternating rounds (lowest - highest) | %.2fx (%.2fx - %.2fx) |\n", NR, m, r[1], r[NR] }'
    [[ -s "$DIR/load.txt" ]] && echo "| $(cat "$DIR/load.txt") |"
    awk -F '\t' -v hz="$HORIZON" -v archive="$ARCHIVE" '
        NR > 1 { t[NR] = $1; b[NR] = $2; l[NR] = $3; lb[NR] = $5; lp[NR] = $6; ap[NR] = $7; d[NR] = $8; n = NR }
        END {
            # From the last third of the run: vacuum reclaims on its own cycle (autovacuum_naptime,
            # 60 s), and the table settles at the size that holds a horizon plus one cycle.
            for (i = 2; i <= n; i++) if (t[i] >= 2 * hz && t[i] >= t[n] * 2 / 3) { m = i; break }
            kept = archive == 1 ? "ledger partitions archived" : "the ledger is kept"
            printf "| steady, reservations at %ss / at %ss (rows) | %d / %d |\n", t[m], t[n], l[m], l[n]
            printf "| steady, reservations table bytes at %ss / at %ss | %.2fx |\n", t[n], t[m], b[n] / b[m]
            printf "| steady, ledger bytes at %ss / at %ss (%d / %d partitions, %d / %d archived) | %.2fx |\n", t[n], t[m], lp[m], lp[n], ap[m], ap[n], lb[n] / lb[m]
            printf "| steady, database bytes at %ss / at %ss (%s) | %.2fx |\n", t[n], t[m], kept, d[n] / d[m]
            lo = hi = d[m]; for (i = m; i <= n; i++) { if (d[i] < lo) lo = d[i]; if (d[i] > hi) hi = d[i] }
            printf "| steady, database bytes from %ss to %ss: lowest / highest sample | %d / %d (%.2fx) |\n", t[m], t[n], lo, hi, hi / lo
        }' "$DIR/steady.tsv"
    [[ "$ARCHIVE" == 1 ]] && echo "| steady, archive files written ($DIR/archive) | $(find "$DIR/archive" -name '*.csv' 2>/dev/null | wc -l) files, $(du -sb "$DIR/archive" 2>/dev/null | cut -f1) bytes |"
    echo "| steady, reservations removed past the horizon | ${REMOVED:-0} |"
    echo
    echo "Hot tables over each growth row (pg_stat_user_tables, reset before the row):"
    echo
    echo "| row | table | inserts | updates | HOT updates | HOT ratio | live | dead | autovacuums | reloptions |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    cat "$DIR/health.md"
    echo
    echo "Steady samples ($DIR/steady.tsv):"
    echo
    column -t "$DIR/steady.tsv"
} | tee "$DIR/table.md"
