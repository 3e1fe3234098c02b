#!/usr/bin/env bash
# Backups of the allocator's database: a continuous WAL archive plus base backups, so that
# ops/restore.sh can recover it to any point in time covered by the archive.
#
#   ops/backup.sh start --url URL --dir DIR   start archiving WAL into DIR/wal (pg_receivewal over
#                                             a replication slot of its own, flushed as it
#                                             arrives) and take a first base backup
#   ops/backup.sh base  --url URL --dir DIR   take another base backup (DIR/base/<UTC time>);
#                                             restores start from the newest one before their
#                                             target, so a recent base makes recovery short
#   ops/backup.sh stop  --dir DIR             stop archiving (the slot stays: `start` resumes
#                                             where it stopped, nothing is missed in between)
#   ops/backup.sh status --dir DIR            archiver running or not, base backups, WAL files
#
# URL is the primary's (one host), as a libpq connection string or URL; the role needs the
# REPLICATION attribute and the server a free WAL sender (max_wal_senders). A base backup is
# usable for targets after the time recorded in DIR/base/<name>.done (its end).
# Knobs: ALLOCATOR_PG_BIN (PostgreSQL client binaries), BACKUP_SLOT (default allocator_backup).
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cmd="${1:-}"
[[ -n "$cmd" ]] && shift
url=""
dir=""
while (($#)); do
    case "$1" in
        --url) url=${2:?--url needs a value}; shift 2 ;;
        --dir) dir=${2:?--dir needs a value}; shift 2 ;;
        -h | --help) print_header_usage "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
case "$cmd" in
    start | base | stop | status) ;;
    -h | --help | "") print_header_usage "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown command '$cmd' (start, base, stop, status)" ;;
esac
[[ -n "$dir" ]] || die "--dir is required"
PG_BIN="$(pg_bin_dir)" || die "no PostgreSQL binaries (install postgresql or set ALLOCATOR_PG_BIN)"
SLOT="${BACKUP_SLOT:-allocator_backup}"
mkdir -p "$dir/wal" "$dir/base"
dir="$(cd "$dir" && pwd)"
PIDFILE="$dir/receivewal.pid"

need_url() { [[ -n "$url" ]] || die "--url is required for '$cmd'"; }

base_backup() {
    local name target
    name="$(date -u +%Y%m%dT%H%M%S%NZ)"
    target="$dir/base/$name"
    step "base backup into $target"
    # -X stream: the backup carries the WAL it needs to be consistent on its own.
    "$PG_BIN/pg_basebackup" -d "$url" -D "$target" -X stream -c fast --no-password \
        || die "pg_basebackup failed"
    # The backup is consistent from its end: restores to a target before this must use an
    # older base.
    date -u +%s.%N >"$target.done"
    ok "base backup $name ($(du -sh "$target" | cut -f1))"
}

case "$cmd" in
    start)
        need_url
        if pid="$(read_pidfile "$PIDFILE")" && pid_alive "$pid"; then
            info "WAL archiver already running (pid $pid)"
        else
            step "WAL archive into $dir/wal (slot $SLOT)"
            "$PG_BIN/pg_receivewal" -d "$url" --slot "$SLOT" --create-slot --if-not-exists \
                --no-password >/dev/null 2>&1 || die "could not create the replication slot $SLOT"
            nohup "$PG_BIN/pg_receivewal" -d "$url" -D "$dir/wal" --slot "$SLOT" --synchronous \
                --no-loop --no-password >>"$dir/receivewal.log" 2>&1 </dev/null &
            echo $! >"$PIDFILE"
            sleep 1
            pid_alive "$(cat "$PIDFILE")" || die "pg_receivewal exited: $(tail -5 "$dir/receivewal.log")"
            ok "archiving (pid $(cat "$PIDFILE"), log $dir/receivewal.log)"
        fi
        base_backup
        ;;
    base)
        need_url
        base_backup
        ;;
    stop)
        if pid="$(read_pidfile "$PIDFILE")"; then
            # SIGTERM makes pg_receivewal flush what it has and exit.
            stop_pid "$pid" pg_receivewal 10 || warn "pg_receivewal did not stop cleanly"
            rm -f "$PIDFILE"
            ok "WAL archiver stopped"
        else
            info "no WAL archiver running"
        fi
        ;;
    status)
        if pid="$(read_pidfile "$PIDFILE")" && pid_alive "$pid"; then
            printf 'archiver  running (pid %s)\n' "$pid"
        else
            printf 'archiver  stopped\n'
        fi
        printf 'base      %s\n' "$(find "$dir/base" -maxdepth 1 -name '*.done' | wc -l)"
        printf 'wal files %s\n' "$(find "$dir/wal" -maxdepth 1 -type f | wc -l)"
        ;;
esac
