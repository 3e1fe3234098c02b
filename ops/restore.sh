#!/usr/bin/env bash
# Point-in-time restore of a backup made by ops/backup.sh, verified before anything may use it.
#
#   ops/restore.sh --backup DIR --to DIR (--target-time TIME | --latest) [--db NAME] [--port PORT]
#   ops/restore.sh --drill      a whole drill on a small private cluster (below); exit 0 = passed
#
#   --backup DIR        what ops/backup.sh wrote (DIR/base, DIR/wal)
#   --to DIR            new directory for the restored server (data, socket, log, check output)
#   --target-time TIME  recover up to this moment (anything `date -d` and PostgreSQL read, e.g.
#                       '2026-11-01 12:00:00.123+00'); --latest replays the whole archive
#   --db NAME           the allocator's database in the cluster (default allocator_demo)
#   --port PORT         port the verified server listens on at the end (default: a free one)
#
# Steps: the newest base backup finished before the target is copied, with the WAL archive, into
# DIR; PostgreSQL recovers to the target and is promoted while it listens on a private Unix
# socket only, so no service can reach it; storage_identity.serving is set to false at once;
# `chaos --dump-database` and `chaos-check` (the chaos run's independent checker: no oversell,
# every row balanced, the ledger sums to every row, no write under a superseded epoch, one
# reserve per reservation, reservations match their ledger rows) judge the restored database.
# Only when it passes does the copy get a new identity — a new storage_identity.cluster_id, the
# old one in restored_from, serving = true — and start listening on 127.0.0.1:PORT. A service
# that works with the live database refuses the copy from then on (another cluster id: DESIGN.md
# §13); services use it only when started against it on purpose. A copy that fails the check is
# stopped and left in DIR, still marked not serving. Prints and writes DIR/restore.env
# (RESTORED_DATABASE_URL, RESTORED_CLUSTER_ID, RESTORED_FROM).
#
# Knobs: ALLOCATOR_PG_BIN, CHAOS_BIN_DIR (where chaos and chaos-check are; default
# $CARGO_TARGET_DIR/debug, built with `cargo build -p chaos` if missing).
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

backup=""
to=""
target=""
latest=0
db="allocator_demo"
port=""
drill=0
while (($#)); do
    case "$1" in
        --backup) backup=${2:?--backup needs a value}; shift 2 ;;
        --to) to=${2:?--to needs a value}; shift 2 ;;
        --target-time) target=${2:?--target-time needs a value}; shift 2 ;;
        --latest) latest=1; shift ;;
        --db) db=${2:?--db needs a value}; shift 2 ;;
        --port) port=${2:?--port needs a value}; shift 2 ;;
        --drill) drill=1; shift ;;
        -h | --help) print_header_usage "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

PG_BIN="$(pg_bin_dir)" || die "no PostgreSQL binaries (install postgresql or set ALLOCATOR_PG_BIN)"
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
CHAOS_BIN_DIR="${CHAOS_BIN_DIR:-$TARGET_DIR/debug}"

as_pg_user() {
    if is_root; then
        (cd / && runuser -u postgres -- "$@")
    else
        "$@"
    fi
}

chaos_bins() {
    if [[ ! -x "$CHAOS_BIN_DIR/chaos" || ! -x "$CHAOS_BIN_DIR/chaos-check" ]]; then
        step "cargo build -p chaos"
        (cd "$REPO_ROOT" && cargo build -p chaos </dev/null) || die "building the checker failed"
    fi
}

# psql on the restored server's private socket.
rpsql() {
    "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -At -h "$to/sock" -p "$port" -U postgres -d "$db" "$@"
}

pg_ctl_restored() { as_pg_user "$PG_BIN/pg_ctl" -D "$to/data" -l "$to/postgres.log" "$@"; }

restore() {
    [[ -d "$backup/base" && -d "$backup/wal" ]] || die "$backup is not a backup made by ops/backup.sh"
    ((latest)) || [[ -n "$target" ]] || die "--target-time or --latest is required"
    [[ -n "$to" ]] || die "--to is required"
    [[ ! -e "$to" ]] || die "$to exists; restore into a new directory"
    port="${port:-$(free_port)}"
    chaos_bins

    # The newest base backup that was finished before the target.
    local target_epoch=9999999999 base="" done_at f
    ((latest)) || target_epoch="$(date -u -d "$target" +%s.%N)" || die "cannot read --target-time '$target'"
    for f in "$backup"/base/*.done; do
        [[ -e "$f" ]] || continue
        done_at="$(cat "$f")"
        if awk -v a="$done_at" -v b="$target_epoch" 'BEGIN { exit !(a <= b) }'; then
            base="${f%.done}"
        fi
    done
    [[ -n "$base" ]] || die "no base backup in $backup finished before the target"
    step "restoring $(basename "$base") into $to"
    mkdir -p "$to"
    to="$(cd "$to" && pwd)"
    cp -a "$base" "$to/data"
    cp -a "$backup/wal" "$to/wal"
    mkdir -p "$to/sock" "$to/check"
    rm -f "$to/data/standby.signal" "$to/data/postmaster.pid"
    {
        # Recovery probes files the archive never had (timeline histories): both copies quiet.
        echo "restore_command = 'cp \"$to/wal/%f\" \"%p\" 2>/dev/null || cp \"$to/wal/%f.partial\" \"%p\" 2>/dev/null'"
        # Recovery refuses lower settings than the backed-up server had; its control file says.
        "$PG_BIN/pg_controldata" "$to/data" | awk -F': *' '
            /^max_connections setting/      { print "max_connections = " $2 }
            /^max_worker_processes setting/ { print "max_worker_processes = " $2 }
            /^max_wal_senders setting/      { print "max_wal_senders = " $2 }
            /^max_prepared_xacts setting/   { print "max_prepared_transactions = " $2 }
            /^max_locks_per_xact setting/   { print "max_locks_per_transaction = " $2 }'
        echo "recovery_target_action = 'promote'"
        ((latest)) || echo "recovery_target_time = '$target'"
        echo "primary_conninfo = ''"
        # A synchronous standby named by the live primary does not follow the copy.
        echo "synchronous_standby_names = ''"
    } >>"$to/data/postgresql.auto.conf"
    touch "$to/data/recovery.signal"
    if is_root; then
        chmod 755 "$to"
        chown -R postgres:postgres "$to"
    fi
    chmod 700 "$to/data"

    step "recovery on a private socket (no TCP listener)"
    pg_ctl_restored -w -t 300 -o "-p $port -k $to/sock -c listen_addresses='' -c archive_mode=off" start \
        >/dev/null || die "the restored server did not start: $(tail -20 "$to/postgres.log")"
    local deadline=$((SECONDS + 300))
    until [[ "$(rpsql -c 'SELECT pg_is_in_recovery()' 2>/dev/null)" == f ]]; do
        ((SECONDS < deadline)) || die "recovery did not finish: $(tail -20 "$to/postgres.log")"
        pg_ctl_restored status >/dev/null || die "the restored server stopped: $(tail -20 "$to/postgres.log")"
        sleep 0.5
    done
    rpsql -c "UPDATE storage_identity SET serving = false" \
        || die "the restored database has no storage_identity (migrate the live one first)"
    ok "recovered and promoted; marked not serving"

    step "invariant check of the restored database"
    "$CHAOS_BIN_DIR/chaos" --dump-database "host=$to/sock port=$port user=postgres dbname=$db" \
        --out "$to/check" >/dev/null || die "dumping the restored database failed"
    if ! "$CHAOS_BIN_DIR/chaos-check" "$to/check"; then
        pg_ctl_restored -m fast -w stop >/dev/null || true
        die "the restored database violates the invariants (see $to/check); it stays stopped and not serving"
    fi

    step "new identity"
    local identity
    identity="$(rpsql -c "UPDATE storage_identity SET restored_from = cluster_id,
                              cluster_id = gen_random_uuid(), serving = true, stamped_at = now()
                          RETURNING cluster_id, restored_from" | tr '|' ' ')"
    read -r new_id old_id <<<"$identity"
    pg_ctl_restored -m fast -w stop >/dev/null
    pg_ctl_restored -w -t 60 -o "-p $port -k $to/sock -c listen_addresses=127.0.0.1 -c archive_mode=off" start \
        >/dev/null || die "restarting the restored server failed: $(tail -20 "$to/postgres.log")"
    {
        printf 'RESTORED_DATABASE_URL=%q\n' "postgres://postgres@127.0.0.1:$port/$db"
        printf 'RESTORED_CLUSTER_ID=%q\n' "$new_id"
        printf 'RESTORED_FROM=%q\n' "$old_id"
        printf 'RESTORED_DATA=%q\n' "$to/data"
    } >"$to/restore.env"
    ok "restored copy verified: cluster id $new_id (restored from $old_id), listening on 127.0.0.1:$port"
    info "stop it with: ${PG_BIN}/pg_ctl -D $to/data stop   (as the postgres user when root)"
    cat "$to/restore.env"
}

# The drill: a private cluster under load, archived; a restore to a moment between two bursts
# of load must hold exactly what was committed by then, pass the checker, and carry a new
# identity.
drill() {
    local rc=0
    # Global: the EXIT trap runs after this function has returned.
    if is_root; then DRILL_DIR="$(mktemp -d /tmp/allocator-drill.XXXXXX)"; else DRILL_DIR="$(mktemp -d)"; fi
    local work="$DRILL_DIR"
    chmod 755 "$work"
    export CLUSTER_DIR="$work/cluster" CLUSTER_PRIVATE=1 CLUSTER_DB_NAME=allocator_drill
    export CLUSTER_SKIP_BUILD=1 CLUSTER_ALLOCATOR_BIN="${CLUSTER_ALLOCATOR_BIN:-$TARGET_DIR/debug/allocator}"
    export CLUSTER_ROUTER_BIN="${CLUSTER_ROUTER_BIN:-$TARGET_DIR/debug/router}"
    local loadtest="${LOADTEST_BIN:-$TARGET_DIR/debug/loadtest}"
    if [[ ! -x "$CLUSTER_ALLOCATOR_BIN" || ! -x "$CLUSTER_ROUTER_BIN" || ! -x "$loadtest" ]]; then
        step "cargo build -p allocator -p router -p loadtest"
        (cd "$REPO_ROOT" && cargo build -p allocator -p router -p loadtest </dev/null) || die "build failed"
    fi
    chaos_bins
    cleanup() {
        if [[ -f "$DRILL_DIR/restored/data/postmaster.pid" ]]; then
            as_pg_user "$PG_BIN/pg_ctl" -D "$DRILL_DIR/restored/data" -m immediate stop >/dev/null 2>&1 || true
        fi
        "$OPS_DIR/backup.sh" stop --dir "$DRILL_DIR/backup" >/dev/null 2>&1 || true
        "$OPS_DIR/cluster.sh" down >/dev/null 2>&1 || true
        rm -rf "$DRILL_DIR"
    }
    trap cleanup EXIT
    "$OPS_DIR/cluster.sh" up >/dev/null || die "cluster up failed"
    # shellcheck disable=SC1091
    source "$CLUSTER_DIR/cluster.env" || die "no cluster env"
    "$OPS_DIR/backup.sh" start --url "$DATABASE_URL" --dir "$work/backup"
    local run=(--target "$ROUTER_URL" --skus 50 --prefix drill --concurrency 4 --confirm-ratio 0.4
        --release-ratio 0.3 --no-progress)
    "$loadtest" seed --target "$ROUTER_URL" --skus 50 --stock 100000 --prefix drill >/dev/null
    "$loadtest" run "${run[@]}" --duration-secs 5 --seed 1 >/dev/null || die "first burst of load failed"
    sleep 1
    local at
    at="$(date -u '+%Y-%m-%d %H:%M:%S.%6N+00')"
    sleep 1
    "$loadtest" run "${run[@]}" --duration-secs 3 --seed 2 >/dev/null || die "second burst of load failed"
    local live="$PG_BIN/psql -X -At -d $DATABASE_URL -c"
    local expected total live_id
    expected="$($live "SELECT count(*) FROM reservations WHERE created_at <= '$at'")"
    total="$($live "SELECT count(*) FROM reservations")"
    live_id="$($live "SELECT cluster_id FROM storage_identity")"
    sleep 1
    "$OPS_DIR/backup.sh" stop --dir "$work/backup"
    backup="$work/backup" to="$work/restored" target="$at" db=allocator_drill port=""
    restore
    # shellcheck disable=SC1091
    source "$to/restore.env"
    local got
    got="$("$PG_BIN/psql" -X -At -d "$RESTORED_DATABASE_URL" -c "SELECT count(*) FROM reservations")"
    info "reservations: $got restored, $expected committed by $at, $total live at the end"
    [[ "$got" == "$expected" ]] || { warn "the restore does not hold what was committed by the target"; rc=1; }
    ((total > expected)) || { warn "the second burst wrote nothing: the drill proves nothing"; rc=1; }
    [[ "$RESTORED_FROM" == "$live_id" && "$RESTORED_CLUSTER_ID" != "$live_id" ]] \
        || { warn "the restored copy does not carry a new identity"; rc=1; }
    ((rc == 0)) && ok "restore drill passed" || warn "restore drill FAILED"
    return "$rc"
}

if ((drill)); then
    drill
else
    restore
fi
