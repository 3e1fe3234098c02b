#!/usr/bin/env bash
# Backups of the allocator's database with pgBackRest, so that ops/restore.sh can recover it to
# any point in time its WAL archive covers. PostgreSQL archives every WAL segment into the
# repository itself (archive_command runs `pgbackrest archive-push`); this script configures the
# stanza and takes the backups.
#
#   ops/backup.sh settings --dir DIR          print the two server settings archiving needs
#   ops/backup.sh start --url URL --dir DIR   write DIR/pgbackrest.conf (repository DIR/repo),
#                                             check the server's settings (dies naming what to
#                                             add), create the stanza, `pgbackrest check` (a WAL
#                                             segment switched and found in the archive), and
#                                             take a full backup
#   ops/backup.sh base --dir DIR [--type T]   another backup: full (default), diff or incr;
#                                             restores start from the newest one finished before
#                                             their target, so a recent one makes recovery short
#   ops/backup.sh stop --dir DIR              switch to a new WAL segment and wait until it is
#                                             archived: the archive then holds every commit so far
#   ops/backup.sh status --dir DIR            `pgbackrest info` (backups, archived WAL range) and
#                                             `pgbackrest verify` (every file against its
#                                             checksum; exit 1 when one does not match)
#
# pgBackRest runs on the database's host (it reads the data directory) as the database's OS user:
# `postgres` when run as root (the repository is handed to it), else the invoking user. URL is the
# primary's, with a superuser role: the data directory, port and Unix socket come from the server
# (`SHOW data_directory`, ...) and pgBackRest connects over that socket as the URL's role.
# Every command accepts --url; only start needs it. Archiving needs `archive_mode = on` (a
# restart) and the archive_command `settings` prints (a reload). WAL reaches the archive a segment
# at a time: `stop` forces a switch, the server's archive_timeout bounds the wait. Nothing of this
# script keeps running: archiving stops only when archive_command no longer names this repository
# ('' pauses it: WAL then accumulates on the server until it is set again). `pgbackrest stop` is
# not used for that, since it also refuses restores' archive-get.
# Knobs: ALLOCATOR_PG_BIN, BACKUP_STANZA (allocator; read by start and settings, the other commands
# take the stanza the configuration names), BACKUP_RETENTION_FULL (2: full backups kept; older
# ones and the WAL only they need are expired after each backup).
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cmd="${1:-}"
[[ -n "$cmd" ]] && shift
url=""
dir=""
type=full
while (($#)); do
    case "$1" in
        --url) url=${2:?--url needs a value}; shift 2 ;;
        --dir) dir=${2:?--dir needs a value}; shift 2 ;;
        --type) type=${2:?--type needs a value}; shift 2 ;;
        -h | --help) print_header_usage "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
case "$cmd" in
    settings | start | base | stop | status) ;;
    -h | --help | "") print_header_usage "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown command '$cmd' (settings, start, base, stop, status)" ;;
esac
[[ -n "$dir" ]] || die "--dir is required"
[[ "$type" =~ ^(full|diff|incr)$ ]] || die "--type must be full, diff or incr"
PG_BIN="$(pg_bin_dir)" || die "no PostgreSQL binaries (install postgresql or set ALLOCATOR_PG_BIN)"
ensure_packages pgbackrest jq
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
CONF="$dir/pgbackrest.conf"
STANZA="${BACKUP_STANZA:-allocator}"
# After `start`, the stanza is the one its configuration names.
if [[ "$cmd" != start && "$cmd" != settings && -f "$CONF" ]]; then
    STANZA="$(awk -F'[][]' '/^\[/ && $2 != "global" { print $2; exit }' "$CONF")"
fi
ARCHIVE_COMMAND="pgbackrest --config=$CONF --stanza=$STANZA archive-push %p"

pgbr() { as_pg_user pgbackrest "--config=$CONF" "--stanza=$STANZA" "$@"; }
need_conf() { [[ -f "$CONF" ]] || die "no $CONF: run 'ops/backup.sh start' first"; }
settings() {
    printf "archive_mode = on\narchive_command = '%s'\n" "${ARCHIVE_COMMAND//\'/\'\'}"
}

# Writes the configuration from what the server says about itself.
configure() {
    [[ -n "$url" ]] || die "--url is required for 'start'"
    local row data port sockets user mode command
    row="$("$PG_BIN/psql" -X -At -F $'\t' -d "$url" -c "SELECT current_setting('data_directory'),
        current_setting('port'), current_setting('unix_socket_directories'),
        current_user, current_setting('archive_mode'), current_setting('archive_command')")" \
        || die "cannot read the server's settings (a superuser role is needed)"
    IFS=$'\t' read -r data port sockets user mode command <<<"$row"
    local socket="${sockets%%,*}"
    socket="${socket# }"
    [[ "$socket" == /* ]] || die "the server has no Unix socket directory; pgBackRest connects over one"
    as_pg_user test -r "$data/PG_VERSION" \
        || die "cannot read $data as the database's OS user: run this on the database's host"
    mkdir -p "$dir/repo" "$dir/log" "$dir/lock" "$dir/spool"
    cat >"$CONF" <<EOF
# Written by ops/backup.sh start; the server's archive_command names this file.
[global]
repo1-path=$dir/repo
repo1-retention-full=${BACKUP_RETENTION_FULL:-2}
log-path=$dir/log
lock-path=$dir/lock
spool-path=$dir/spool
log-level-console=warn
log-level-file=info
start-fast=y
compress-type=lz4

[$STANZA]
pg1-path=$data
pg1-port=$port
pg1-socket-path=$socket
pg1-user=$user
EOF
    if is_root; then
        chown -R postgres:postgres "$dir"
    fi
    if [[ "$mode" != on && "$mode" != always || "$command" != "$ARCHIVE_COMMAND" ]]; then
        err "the server does not archive WAL into $dir/repo (archive_mode = $mode, archive_command = '$command')"
        err "add to its configuration (postgresql.conf or ALTER SYSTEM), restart it for archive_mode, then run start again:"
        settings >&2
        exit 1
    fi
}

# Takes a backup of type $1 and names it.
backup() {
    step "pgBackRest $1 backup"
    pgbr backup "--type=$1" || die "pgbackrest backup failed (log: $dir/log)"
    local last
    last="$(pgbr info --output=json | jq -r '.[0].backup[-1] | "\(.label) (\(.type): \(.info.size / 1e6 | floor) MB, \(.info.repository.delta / 1e6 * 10 | floor / 10) MB stored)"')"
    ok "backup $last"
}

case "$cmd" in
    settings)
        settings
        ;;
    start)
        step "pgBackRest stanza $STANZA in $dir"
        configure
        pgbr stanza-create || die "pgbackrest stanza-create failed (log: $dir/log)"
        # A WAL switch that must reach the archive: archive_command works end to end.
        pgbr check || die "pgbackrest check failed: is WAL being archived? (log: $dir/log)"
        ok "stanza $STANZA created; WAL archiving checked"
        backup full
        ;;
    base)
        need_conf
        backup "$type"
        ;;
    stop)
        need_conf
        step "archiving the current WAL segment"
        pgbr check || die "pgbackrest check failed: the archive may lack recent WAL (log: $dir/log)"
        ok "archive holds every commit so far; archiving continues while archive_command names $CONF"
        ;;
    status)
        need_conf
        pgbr info
        # Every file of every backup and every archived WAL segment against its manifest's
        # checksum; verify exits 0 even when it finds some invalid, hence the text test.
        out="$(pgbr verify --output=text)" || die "pgbackrest verify failed (log: $dir/log)"
        [[ "$out" != *"status: error"* ]] || die "pgbackrest verify: the repository has invalid files"$'\n'"$out"
        ok "pgbackrest verify: every backup file and archived WAL segment matches its checksum"
        ;;
esac
