#!/usr/bin/env bash
# Point-in-time restore of a backup made by ops/backup.sh (pgBackRest), verified before anything
# may use it.
#
#   ops/restore.sh --backup DIR --to DIR (--target-time TIME | --latest) [--db NAME] [--port PORT]
#   ops/restore.sh --drill      a whole drill on a small private cluster (below); exit 0 = passed
#
#   --backup DIR        what ops/backup.sh wrote (DIR/pgbackrest.conf, the repository DIR/repo)
#   --to DIR            new directory for the restored server (data, socket, log, check output)
#   --target-time TIME  recover up to this moment (anything `date -d` and PostgreSQL read, e.g.
#                       '2026-11-01 12:00:00.123+00'); --latest replays the whole archive
#   --db NAME           the allocator's database in the cluster (default allocator_demo)
#   --port PORT         port the verified server listens on at the end (default: a free one)
#
# Steps: `pgbackrest restore` writes the newest backup finished before the target into DIR/data,
# archiving off; PostgreSQL recovers to the target (WAL from `archive-get`) and is promoted while
# it listens on a private Unix socket only, so no service can reach it; storage_identity.serving
# is set to false at once; `chaos --dump-database` and `chaos-check` (the chaos run's checker: no
# oversell, rows balanced, the ledger sums to every row, no write under a superseded epoch, one
# reserve per reservation, reservations match their ledger rows) judge it. Only when it passes
# does the copy get a new identity (a new storage_identity.cluster_id, the old one in
# restored_from, serving = true) and listen on 127.0.0.1:PORT; services that work with the live
# database refuse it (another cluster id: DESIGN.md §13). A copy that fails the check is stopped
# and left in DIR, not serving. Prints and writes DIR/restore.env (RESTORED_DATABASE_URL,
# RESTORED_CLUSTER_ID, RESTORED_FROM, RESTORED_DATA). The drill then starts 2 allocators and a
# router on the copy (ops/cluster.sh up --database-url) and checks a reserve, its replay and a
# confirm through the router's API.
#
# Knobs: ALLOCATOR_PG_BIN, CHAOS_BIN_DIR (where chaos and chaos-check are; default
# $CARGO_TARGET_DIR/debug, built with `cargo build -p chaos` if missing).
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

backup="" to="" target="" latest=0 db="allocator_demo" port="" drill=0
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

chaos_bins() {
    if [[ ! -x "$CHAOS_BIN_DIR/chaos" || ! -x "$CHAOS_BIN_DIR/chaos-check" ]]; then
        step "cargo build -p chaos"
        (cd "$REPO_ROOT" && cargo build -p chaos </dev/null) || die "building the checker failed"
    fi
}

# psql on the restored server's private socket.
rpsql() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -At -h "$to/sock" -p "$port" -U postgres -d "$db" "$@"; }

pg_ctl_restored() { as_pg_user "$PG_BIN/pg_ctl" -D "$to/data" -l "$to/postgres.log" "$@"; }

restore() {
    local conf="$backup/pgbackrest.conf"
    [[ -f "$conf" ]] || die "$backup is not a backup made by ops/backup.sh (no pgbackrest.conf)"
    ((latest)) || [[ -n "$target" ]] || die "--target-time or --latest is required"
    [[ -n "$to" ]] || die "--to is required"
    [[ ! -e "$to" ]] || die "$to exists; restore into a new directory"
    ensure_packages pgbackrest jq
    port="${port:-$(free_port)}"
    chaos_bins
    local stanza recovery=()
    stanza="$(awk -F'[][]' '/^\[/ && $2 != "global" { print $2; exit }' "$conf")"
    pgbr() { as_pg_user pgbackrest "--config=$conf" "--stanza=$stanza" "$@"; }
    if ((!latest)); then
        # pgBackRest takes the newest backup finished before the target, else its latest one,
        # which recovery could not stop before: refuse that here.
        local target_epoch
        target_epoch="$(date -u -d "$target" +%s)" || die "cannot read --target-time '$target'"
        pgbr info --output=json | jq -e --argjson t "$target_epoch" \
            'any(.[0].backup[]; .timestamp.stop < $t)' >/dev/null \
            || die "no backup in $backup finished before the target"
        recovery=(--type=time "--target=$target" --target-action=promote)
    fi
    mkdir -p "$to/sock" "$to/check"
    to="$(cd "$to" && pwd)"
    ! is_root || { chmod 755 "$to" && chown -R postgres:postgres "$to"; }
    step "pgbackrest restore into $to/data"
    # The copy must never push WAL into the live server's archive: archiving off.
    pgbr restore "--pg1-path=$to/data" --archive-mode=off "${recovery[@]}" --log-level-console=info \
        >"$to/pgbackrest-restore.log" 2>&1 || die "pgbackrest restore failed: $(tail -5 "$to/pgbackrest-restore.log")"
    info "$(grep -o 'restore backup set .*' "$to/pgbackrest-restore.log")"
    {
        echo "archive_command = ''"
        # Recovery refuses lower max_connections, max_worker_processes, max_wal_senders,
        # max_prepared_transactions, max_locks_per_transaction than the backed-up server had.
        "$PG_BIN/pg_controldata" "$to/data" | awk -F': *' '/^max_[a-z_]+ setting:/ {
            n = $1; sub(/ setting$/, "", n); sub(/xact/, "transaction", n); print n " = " $2 }'
        echo "primary_conninfo = ''"
        # A synchronous standby named by the live primary does not follow the copy.
        echo "synchronous_standby_names = ''"
    } >>"$to/data/postgresql.auto.conf"

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
        RETURNING cluster_id, restored_from")" || die "stamping the new identity failed"
    read -r new_id old_id <<<"${identity/|/ }"
    pg_ctl_restored -m fast -w stop >/dev/null
    pg_ctl_restored -w -t 60 -o "-p $port -k $to/sock -c listen_addresses=127.0.0.1 -c archive_mode=off" start \
        >/dev/null || die "restarting the restored server failed: $(tail -20 "$to/postgres.log")"
    printf 'RESTORED_DATABASE_URL=%q\nRESTORED_CLUSTER_ID=%q\nRESTORED_FROM=%q\nRESTORED_DATA=%q\n' \
        "postgres://postgres@127.0.0.1:$port/$db" "$new_id" "$old_id" "$to/data" >"$to/restore.env"
    ok "restored copy verified: cluster id $new_id (restored from $old_id), listening on 127.0.0.1:$port"
    info "stop it with: ${PG_BIN}/pg_ctl -D $to/data stop   (as the postgres user when root)"
    cat "$to/restore.env"
}

# serve_check ROUTER_URL: through a router on the restored copy, a restock of a new SKU, a reserve,
# its replay (the same answer, one hold) and a confirm, each answer checked. 1 = failed.
serve_check() {
    local router=$1 n="$RANDOM$RANDOM" body code first rc=0
    local id="drill-restored-$n" sku="drill-restored-sku-$n"
    call() { code="$(curl -s -o "$DRILL_DIR/body" -D "$DRILL_DIR/headers" -w '%{http_code}' \
        --max-time 10 -X POST -H 'Content-Type: application/json' "$router$1" -d "${2:-}")" || true
        body="$(cat "$DRILL_DIR/body" 2>/dev/null)"; }
    expect() { [[ "$1" == "$2" ]] || { warn "restored copy, $3: expected $2, got $1 (last answer $body)"; rc=1; }; }
    call "/v1/inventory/$sku/adjustments" "{\"adjustment_id\":\"$id\",\"delta\":10}"
    expect "$code" 201 "restock of 10 $sku"
    local reserve="{\"reservation_id\":\"$id\",\"sku\":\"$sku\",\"quantity\":2,\"ttl_seconds\":600}"
    call /v1/reservations "$reserve"
    first="$body"
    expect "$code $(jq -r .status <<<"$body")" "201 held" "reserve $id of 2"
    call /v1/reservations "$reserve"
    expect "$code $(tr -d '\r' <"$DRILL_DIR/headers" | grep -ci '^idempotent-replayed: true$')" "200 1" "replay"
    expect "$(jq -cS . <<<"$body")" "$(jq -cS . <<<"$first")" "replay's answer"
    expect "$(curl -s "$router/v1/inventory/$sku" | jq -c '[.available, .held]')" "[8,2]" "stock after the replay"
    call "/v1/reservations/$id/confirm"
    expect "$code $(jq -r .status <<<"$body")" "200 confirmed" "confirm"
    expect "$("$PG_BIN/psql" -X -At -d "$RESTORED_DATABASE_URL" -c \
        "SELECT status FROM reservations WHERE reservation_id = '$id'")" confirmed "the row in the copy"
    ((rc == 0)) && ok "the copy served a restock, a reserve, its replay and a confirm as specified"
    return "$rc"
}

# The drill: a private cluster under load, archived; a restore to a moment between two bursts
# of load must hold exactly what was committed by then, pass the checker, carry a new identity,
# and serve reserves through allocators and a router started on it.
drill() {
    local rc=0
    # Global: the EXIT trap runs after this function has returned.
    if is_root; then DRILL_DIR="$(mktemp -d /tmp/allocator-drill.XXXXXX)"; else DRILL_DIR="$(mktemp -d)"; fi
    local work="$DRILL_DIR"
    chmod 755 "$work"
    # archive_mode needs a restart, so it is set at start; archive_command (it holds spaces,
    # which CLUSTER_PG_OPTIONS cannot carry) only needs a reload and is set below.
    export CLUSTER_DIR="$work/cluster" CLUSTER_PRIVATE=1 CLUSTER_DB_NAME=allocator_drill
    export CLUSTER_PG_OPTIONS="${CLUSTER_PG_OPTIONS:-} -c archive_mode=on"
    export CLUSTER_SKIP_BUILD=1 CLUSTER_ALLOCATOR_BIN="${CLUSTER_ALLOCATOR_BIN:-$TARGET_DIR/debug/allocator}"
    export CLUSTER_ROUTER_BIN="${CLUSTER_ROUTER_BIN:-$TARGET_DIR/debug/router}"
    local loadtest="${LOADTEST_BIN:-$TARGET_DIR/debug/loadtest}"
    if [[ ! -x "$CLUSTER_ALLOCATOR_BIN" || ! -x "$CLUSTER_ROUTER_BIN" || ! -x "$loadtest" ]]; then
        step "cargo build -p allocator -p router -p loadtest"
        (cd "$REPO_ROOT" && cargo build -p allocator -p router -p loadtest </dev/null) || die "build failed"
    fi
    chaos_bins
    ensure_packages pgbackrest curl jq
    cleanup() {
        CLUSTER_DIR="$DRILL_DIR/served" "$OPS_DIR/cluster.sh" down >/dev/null 2>&1 || true
        [[ ! -f "$DRILL_DIR/restored/data/postmaster.pid" ]] \
            || as_pg_user "$PG_BIN/pg_ctl" -D "$DRILL_DIR/restored/data" -m immediate stop >/dev/null 2>&1 || true
        "$OPS_DIR/cluster.sh" down >/dev/null 2>&1 || true
        rm -rf "$DRILL_DIR"
    }
    trap cleanup EXIT
    "$OPS_DIR/cluster.sh" up >/dev/null || die "cluster up failed"
    # shellcheck disable=SC1091
    source "$CLUSTER_DIR/cluster.env" || die "no cluster env"
    local live="$PG_BIN/psql -X -At -d $DATABASE_URL -c" archive_command
    archive_command="$("$OPS_DIR/backup.sh" settings --dir "$work/backup" | sed -n 's/^archive_command = //p')"
    $live "ALTER SYSTEM SET archive_command = $archive_command" -c "SELECT pg_reload_conf()" >/dev/null
    for _ in {1..50}; do [[ "$($live 'SHOW archive_command')" == pgbackrest* ]] && break; sleep 0.1; done
    "$OPS_DIR/backup.sh" start --url "$DATABASE_URL" --dir "$work/backup"
    local run=(--target "$ROUTER_URL" --skus 50 --prefix drill --concurrency 4 --confirm-ratio 0.4
        --release-ratio 0.3 --no-progress)
    "$loadtest" seed --target "$ROUTER_URL" --skus 50 --stock 100000 --prefix drill >/dev/null
    "$loadtest" run "${run[@]}" --duration-secs 5 --seed 1 >/dev/null || die "first burst of load failed"
    # Restores must take this incremental backup, not the one after the target.
    "$OPS_DIR/backup.sh" base --dir "$work/backup" --type incr
    sleep 1
    local at expected total live_id
    at="$(date -u '+%Y-%m-%d %H:%M:%S.%6N+00')"
    sleep 1
    "$loadtest" run "${run[@]}" --duration-secs 3 --seed 2 >/dev/null || die "second burst of load failed"
    "$OPS_DIR/backup.sh" base --dir "$work/backup" --type incr
    read -r expected total live_id <<<"$($live "SELECT (SELECT count(*) FROM reservations WHERE
        created_at <= '$at'), (SELECT count(*) FROM reservations), cluster_id FROM storage_identity" | tr '|' ' ')"
    "$OPS_DIR/backup.sh" stop --dir "$work/backup"
    "$OPS_DIR/backup.sh" status --dir "$work/backup" >/dev/null || die "the repository does not verify"
    "$OPS_DIR/cluster.sh" down >/dev/null 2>&1 || warn "stopping the live cluster failed"
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
    step "allocators and a router on the restored copy"
    CLUSTER_DIR="$work/served" CLUSTER_ALLOCATORS=2 CLUSTER_ROUTERS=1 "$OPS_DIR/cluster.sh" up \
        --database-url "$RESTORED_DATABASE_URL" >"$work/served.log" 2>&1 \
        || die "services on the restored copy did not start: $(tail -20 "$work/served.log")"
    # shellcheck disable=SC1091
    serve_check "$(source "$work/served/cluster.env" && echo "$ROUTER_URL")" || rc=1
    if ((rc == 0)); then ok "restore drill passed"; else warn "restore drill FAILED"; fi
    return "$rc"
}

if ((drill)); then drill; else restore; fi
