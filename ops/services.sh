#!/usr/bin/env bash
# PostgreSQL and Redis for a local allocator cluster.
#
#   ops/services.sh up       provide both, write .cluster/env (DATABASE_URL, REDIS_URL)
#   ops/services.sh down     stop what `up` started (never a system service)
#   ops/services.sh env      print the env file (eval "$(ops/services.sh env)")
#   ops/services.sh status   say what is in use and whether it answers
#
# PostgreSQL: when a server answers on 127.0.0.1:5432 it is used with a dedicated database
# ($CLUSTER_DB_NAME, default allocator_demo) that `up` drops and recreates, so every demo starts
# fresh. Nothing else on that server is touched. Otherwise (or with CLUSTER_PRIVATE=1 /
# CLUSTER_PRIVATE_PG=1) a private, disposable instance is initdb'ed and started on a free port.
# As root it runs as the `postgres` user with its data under /tmp/allocator-cluster-0/<id>/
# (postgres cannot traverse /root); otherwise under .cluster/pg.
#
# Redis: 127.0.0.1:6379 when it answers PING, else (or with CLUSTER_PRIVATE=1 /
# CLUSTER_PRIVATE_REDIS=1) a private redis-server on a free port, daemonized, no persistence,
# pidfile and log under .cluster/redis/.
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DB_NAME="${CLUSTER_DB_NAME:-allocator_demo}"
SYS_PG_HOST="${CLUSTER_SYSTEM_PG_HOST:-127.0.0.1}"
SYS_PG_PORT="${CLUSTER_SYSTEM_PG_PORT:-5432}"
SYS_PG_USER="${CLUSTER_SYSTEM_PG_USER:-postgres}"
SYS_REDIS_HOST="${CLUSTER_SYSTEM_REDIS_HOST:-127.0.0.1}"
SYS_REDIS_PORT="${CLUSTER_SYSTEM_REDIS_PORT:-6379}"
STATE_DIR="$CLUSTER_DIR/services"
ENV_FILE="$CLUSTER_DIR/env"

# The database is dropped by `up`; refuse anything that is not obviously ours.
[[ "$DB_NAME" =~ ^allocator_[a-z0-9_]+$ ]] \
    || die "CLUSTER_DB_NAME must match ^allocator_[a-z0-9_]+\$ (it is dropped and recreated), got '$DB_NAME'"

truthy() { [[ "${1:-}" =~ ^(1|true|yes|on)$ ]]; }

want_private_pg() { truthy "${CLUSTER_PRIVATE:-}" || truthy "${CLUSTER_PRIVATE_PG:-}"; }
want_private_redis() { truthy "${CLUSTER_PRIVATE:-}" || truthy "${CLUSTER_PRIVATE_REDIS:-}"; }

state_get() { [[ -r "$STATE_DIR/$1" ]] && cat "$STATE_DIR/$1"; }
state_set() { mkdir -p "$STATE_DIR" && printf '%s\n' "$2" >"$STATE_DIR/$1"; }

# --- PostgreSQL ------------------------------------------------------------------------------

# Where a private instance lives. Root: outside the repository, because the `postgres` user
# must own and reach it and usually cannot traverse /root. One directory per CLUSTER_DIR so that
# several checkouts do not collide.
private_pg_base() {
    if is_root; then
        local id
        id="$(printf '%s' "$CLUSTER_DIR" | md5sum | cut -c1-10)"
        printf '/tmp/allocator-cluster-%s/%s\n' "$(id -u)" "$id"
    else
        printf '%s/pg\n' "$CLUSTER_DIR"
    fi
}

# Runs a PostgreSQL server tool as the user that owns the private instance.
as_pg_user() {
    if is_root; then
        (cd / && runuser -u postgres -- "$@")
    else
        "$@"
    fi
}

pg_ready() { # host port
    "$PG_BIN/pg_isready" -q -h "$1" -p "$2" -t 2 >/dev/null 2>&1
}

psql_sys() {
    PGOPTIONS="-c client_min_messages=warning" "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$SYS_PG_HOST" -p "$SYS_PG_PORT" -U "$SYS_PG_USER" \
        -d postgres "$@"
}

# Uses the system server: recreate the dedicated database. Returns 1 when that is impossible
# (server does not answer, or our user cannot log in / create databases).
pg_up_system() {
    pg_ready "$SYS_PG_HOST" "$SYS_PG_PORT" || return 1
    local out
    if ! out="$(psql_sys -At -c 'select rolcreatedb or rolsuper from pg_roles where rolname = current_user' 2>&1)"; then
        warn "PostgreSQL on $SYS_PG_HOST:$SYS_PG_PORT answers but '$SYS_PG_USER' cannot log in: $out"
        return 1
    fi
    [[ "$out" == t ]] || { warn "'$SYS_PG_USER' may not create databases on $SYS_PG_HOST:$SYS_PG_PORT"; return 1; }
    info "PostgreSQL: using the server on $SYS_PG_HOST:$SYS_PG_PORT, database $DB_NAME (recreated)"
    psql_sys -c "DROP DATABASE IF EXISTS \"$DB_NAME\" WITH (FORCE)" >/dev/null \
        || die "could not drop database $DB_NAME on $SYS_PG_HOST:$SYS_PG_PORT"
    psql_sys -c "CREATE DATABASE \"$DB_NAME\"" >/dev/null \
        || die "could not create database $DB_NAME on $SYS_PG_HOST:$SYS_PG_PORT"
    state_set pg.mode system
    DATABASE_URL="postgres://$SYS_PG_USER@$SYS_PG_HOST:$SYS_PG_PORT/$DB_NAME"
}

# Server options of a private instance (primary and standby alike: a standby refuses to start with
# a lower max_connections than its primary). A throwaway demo/test instance skips durability;
# CLUSTER_PG_DURABLE=1 keeps PostgreSQL's defaults (fsync, synchronous commit), e.g. to benchmark
# what batching saves per commit. A synchronous standby needs synchronous_commit=on.
private_pg_opts() {
    local opts="-c listen_addresses=127.0.0.1 -c max_connections=200"
    if [[ -z "${CLUSTER_PG_DURABLE:-}" ]]; then
        opts+=" -c fsync=off -c full_page_writes=off"
        [[ "${CLUSTER_PG_STANDBY:-}" == sync ]] || opts+=" -c synchronous_commit=off"
    fi
    # Extra server settings, e.g. shared_preload_libraries=pg_stat_statements for a benchmark.
    opts+="${CLUSTER_PG_OPTIONS:+ $CLUSTER_PG_OPTIONS}"
    printf '%s\n' "$opts"
}

# CLUSTER_PG_STANDBY=sync|async: a streaming standby of the private instance (pg_basebackup -R),
# synchronous or not; DATABASE_URL then names both servers, primary first.
pg_up_standby() {
    local base data logf primary port
    base="$(state_get pg.base)"
    primary="$(state_get pg.port)"
    data="$base/standby"
    logf="$base/standby.log"
    info "PostgreSQL: ${CLUSTER_PG_STANDBY} standby of 127.0.0.1:$primary in $data"
    quiet as_pg_user "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$primary" -U postgres -D "$data" \
        -R -X stream -c fast 8>&- 9>&- || die "pg_basebackup for the standby failed"
    port="$(free_port)"
    quiet as_pg_user "$PG_BIN/pg_ctl" -D "$data" -l "$logf" -w -t 60 \
        -o "-p $port -k $base $(private_pg_opts)" start 8>&- 9>&- \
        || die "the standby did not start (log: $logf)"
    state_set pg.standby_port "$port"
    if [[ "$CLUSTER_PG_STANDBY" == sync ]]; then
        local sql=("$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$primary" -U postgres -d postgres -c)
        "${sql[@]}" "ALTER SYSTEM SET synchronous_standby_names = '*'" >/dev/null \
            && "${sql[@]}" "SELECT pg_reload_conf()" >/dev/null \
            || die "could not make the standby synchronous"
    fi
    ok "PostgreSQL: ${CLUSTER_PG_STANDBY} standby on 127.0.0.1:$port (log $logf)"
    DATABASE_URL="postgres://postgres@127.0.0.1:$primary,127.0.0.1:$port/$DB_NAME?target_session_attrs=read-write"
}

pg_up_private() {
    local base data logf port attempt
    base="$(private_pg_base)"
    data="$base/data"
    logf="$base/postgres.log"
    if is_root; then
        id -u postgres >/dev/null 2>&1 \
            || die "running as root needs the 'postgres' system user to run a private PostgreSQL (install the postgresql package)"
        local parent
        parent="$(dirname "$base")"
        mkdir -p "$parent"
        # /tmp is shared: make sure the parent is a real directory that we own.
        [[ -d "$parent" && ! -L "$parent" && -O "$parent" ]] || die "$parent is not a directory owned by $(id -un)"
        chmod 755 "$parent"
    fi
    rm -rf "$base"
    mkdir -p "$base"
    chmod 700 "$base"
    is_root && chown postgres:postgres "$base"
    state_set pg.mode private
    state_set pg.base "$base"
    state_set pg.bin "$PG_BIN"
    # Expose the instance's files next to the rest of the cluster's state.
    if is_root; then
        ln -sfn "$base" "$CLUSTER_DIR/pg"
    fi

    info "PostgreSQL: initdb of a private instance in $data"
    quiet as_pg_user "$PG_BIN/initdb" -D "$data" -U postgres -A trust -E UTF8 --locale=C -N \
        || die "initdb failed"

    local pg_opts
    pg_opts="$(private_pg_opts)"
    for attempt in 1 2 3; do
        port="${CLUSTER_PG_PORT:-$(free_port)}"
        # 8>&- 9>&-: the server must not inherit (and so hold forever) the ops/ lock files.
        if quiet as_pg_user "$PG_BIN/pg_ctl" -D "$data" -l "$logf" -w -t 60 \
            -o "-p $port -k $base $pg_opts" \
            start 8>&- 9>&-; then
            state_set pg.port "$port"
            break
        fi
        warn "private PostgreSQL did not start on port $port (attempt $attempt); log tail:"
        tail -n 15 "$logf" >&2 || true
        port=""
        [[ -n "${CLUSTER_PG_PORT:-}" ]] && break
    done
    [[ -n "$port" ]] || die "could not start a private PostgreSQL (log: $logf)"
    "$PG_BIN/createdb" -h 127.0.0.1 -p "$port" -U postgres "$DB_NAME" || die "createdb $DB_NAME failed"
    ok "PostgreSQL: private instance on 127.0.0.1:$port (data $data, log $logf)"
    DATABASE_URL="postgres://postgres@127.0.0.1:$port/$DB_NAME"
}

pg_down() {
    local mode base bin
    mode="$(state_get pg.mode)" || return 0
    if [[ "$mode" == private ]]; then
        base="$(state_get pg.base)"
        bin="$(state_get pg.bin)"
        if [[ -n "$base" && -f "$base/standby/postmaster.pid" ]]; then
            info "PostgreSQL: stopping the standby"
            quiet as_pg_user "$bin/pg_ctl" -D "$base/standby" -m fast -w -t 60 stop \
                || warn "pg_ctl stop of the standby failed (data $base/standby)"
        fi
        if [[ -n "$base" && -f "$base/data/postmaster.pid" ]]; then
            info "PostgreSQL: stopping the private instance ($base)"
            quiet as_pg_user "$bin/pg_ctl" -D "$base/data" -m fast -w -t 60 stop \
                || warn "pg_ctl stop failed; the instance may still run (data $base/data)"
        fi
        if [[ -n "$base" && -z "${CLUSTER_KEEP_DATA:-}" ]]; then
            # Only ever delete the directory we created (it sits under our runtime dir).
            case "$base" in
                /tmp/allocator-cluster-*/* | "$CLUSTER_DIR"/pg) rm -rf "$base" ;;
                *) warn "not deleting unexpected private PostgreSQL dir $base" ;;
            esac
        fi
        [[ -L "$CLUSTER_DIR/pg" ]] && rm -f "$CLUSTER_DIR/pg"
    elif [[ -z "${_PRE_CLEAN:-}" ]]; then
        info "PostgreSQL: system server left running (database $DB_NAME kept for inspection; the next up recreates it)"
    fi
    rm -f "$STATE_DIR"/pg.*
}

# --- Redis -----------------------------------------------------------------------------------

# redis_ping HOST PORT: true when a Redis answers PING (bash /dev/tcp, no redis-cli needed).
redis_ping() {
    local reply=""
    {
        exec 3<>"/dev/tcp/$1/$2" || return 1
        printf 'PING\r\n' >&3
        IFS= read -r -t 2 reply <&3 || true
        exec 3>&-
    } 2>/dev/null
    [[ "$reply" == "+PONG"* ]]
}

redis_up_system() {
    redis_ping "$SYS_REDIS_HOST" "$SYS_REDIS_PORT" || return 1
    info "Redis: using the server on $SYS_REDIS_HOST:$SYS_REDIS_PORT"
    state_set redis.mode system
    REDIS_URL="redis://$SYS_REDIS_HOST:$SYS_REDIS_PORT/"
}

redis_up_private() {
    local bin dir port attempt deadline
    bin="$(redis_server_bin)" || die "redis-server not installed"
    dir="$CLUSTER_DIR/redis"
    rm -rf "$dir"
    mkdir -p "$dir"
    state_set redis.mode private
    state_set redis.bin "$bin"
    for attempt in 1 2 3; do
        port="${CLUSTER_REDIS_PORT:-$(free_port)}"
        rm -f "$dir/redis.pid"
        if "$bin" --port "$port" --bind 127.0.0.1 --daemonize yes \
            --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --dir "$dir" \
            --save '' --appendonly no >/dev/null 2>&1 8>&- 9>&-; then
            deadline=$((SECONDS + 15))
            while ((SECONDS < deadline)); do
                redis_ping 127.0.0.1 "$port" && break
                sleep 0.1
            done
            if redis_ping 127.0.0.1 "$port"; then
                state_set redis.port "$port"
                ok "Redis: private redis-server on 127.0.0.1:$port (pid $(read_pidfile "$dir/redis.pid" || echo '?'), log $dir/redis.log)"
                REDIS_URL="redis://127.0.0.1:$port/"
                return 0
            fi
        fi
        warn "private redis-server did not come up on port $port (attempt $attempt)"
        tail -n 10 "$dir/redis.log" >&2 2>/dev/null || true
        redis_stop_private
        [[ -n "${CLUSTER_REDIS_PORT:-}" ]] && break
    done
    die "could not start a private redis-server (log: $dir/redis.log)"
}

redis_stop_private() {
    local dir="$CLUSTER_DIR/redis" pid bin
    bin="$(state_get redis.bin || true)"
    pid="$(read_pidfile "$dir/redis.pid")" || return 0
    stop_pid "$pid" redis-server 15 "$bin" || true
    rm -f "$dir/redis.pid"
}

redis_down() {
    local mode
    mode="$(state_get redis.mode)" || return 0
    if [[ "$mode" == private ]]; then
        info "Redis: stopping the private redis-server"
        redis_stop_private
    elif [[ -z "${_PRE_CLEAN:-}" ]]; then
        info "Redis: system server left running"
    fi
    rm -f "$STATE_DIR"/redis.*
}

# --- commands --------------------------------------------------------------------------------

write_env() {
    local tmp="$ENV_FILE.tmp"
    {
        echo "# written by ops/services.sh up at $(date -Is); source it or: eval \"\$(ops/services.sh env)\""
        printf 'export DATABASE_URL=%q\n' "$DATABASE_URL"
        printf 'export REDIS_URL=%q\n' "$REDIS_URL"
        printf 'export CLUSTER_PG_MODE=%q\n' "$(state_get pg.mode)"
        printf 'export CLUSTER_REDIS_MODE=%q\n' "$(state_get redis.mode)"
    } >"$tmp"
    mv "$tmp" "$ENV_FILE"
}

cmd_up() {
    ensure_packages postgresql redis
    PG_BIN="$(pg_bin_dir)" || die "no PostgreSQL server binaries found"
    mkdir -p "$CLUSTER_DIR" "$STATE_DIR"
    # Start from a clean slate: whatever a previous `up` started goes away first.
    _PRE_CLEAN=1 cmd_down_quiet

    DATABASE_URL="" REDIS_URL=""
    case "${CLUSTER_PG_STANDBY:-}" in
        "") ;;
        sync | async) want_private_pg || die "CLUSTER_PG_STANDBY needs a private PostgreSQL (CLUSTER_PRIVATE=1)" ;;
        *) die "CLUSTER_PG_STANDBY must be sync or async, got '$CLUSTER_PG_STANDBY'" ;;
    esac
    if want_private_pg; then
        info "PostgreSQL: private instance requested (CLUSTER_PRIVATE/CLUSTER_PRIVATE_PG)"
        pg_up_private
        [[ -z "${CLUSTER_PG_STANDBY:-}" ]] || pg_up_standby
    elif ! pg_up_system; then
        info "PostgreSQL: nothing usable on $SYS_PG_HOST:$SYS_PG_PORT; starting a private instance"
        pg_up_private
    fi
    if want_private_redis; then
        info "Redis: private instance requested (CLUSTER_PRIVATE/CLUSTER_PRIVATE_REDIS)"
        redis_up_private
    elif ! redis_up_system; then
        info "Redis: nothing answers on $SYS_REDIS_HOST:$SYS_REDIS_PORT; starting a private instance"
        redis_up_private
    fi
    write_env
    ok "services up: DATABASE_URL=$DATABASE_URL REDIS_URL=$REDIS_URL (env: $ENV_FILE)"
}

cmd_down_quiet() {
    redis_down
    pg_down
}

cmd_down() {
    if [[ ! -d "$STATE_DIR" ]] || [[ -z "$(ls -A "$STATE_DIR" 2>/dev/null)" ]]; then
        info "services: nothing recorded as started (no $STATE_DIR state)"
    fi
    cmd_down_quiet
    rm -f "$ENV_FILE"
    ok "services down"
}

cmd_env() {
    [[ -r "$ENV_FILE" ]] || die "no $ENV_FILE; run ops/services.sh up first"
    grep -v '^#' "$ENV_FILE"
}

cmd_status() {
    if ! load_cluster_env; then
        echo "services: not up (no $ENV_FILE)"
        return 1
    fi
    PG_BIN="$(pg_bin_dir)" || PG_BIN=""
    local rc=0 pg_state redis_state hostport
    hostport="${DATABASE_URL#*@}"
    hostport="${hostport%%/*}"
    if [[ -n "$PG_BIN" ]] && pg_ready "${hostport%%:*}" "${hostport##*:}"; then pg_state=up; else pg_state=DOWN; rc=1; fi
    hostport="${REDIS_URL#redis://}"
    hostport="${hostport%%/*}"
    if redis_ping "${hostport%%:*}" "${hostport##*:}"; then redis_state=up; else redis_state=DOWN; rc=1; fi
    printf 'postgresql  %-8s %-4s %s\n' "${CLUSTER_PG_MODE:-?}" "$pg_state" "$DATABASE_URL"
    printf 'redis       %-8s %-4s %s\n' "${CLUSTER_REDIS_MODE:-?}" "$redis_state" "$REDIS_URL"
    return "$rc"
}

with_lock() {
    mkdir -p "$CLUSTER_DIR"
    exec 9>"$CLUSTER_DIR/.services.lock"
    flock -w 300 9 || die "another ops/services.sh holds $CLUSTER_DIR/.services.lock"
    "$@"
}

usage() {
    print_header_usage "${BASH_SOURCE[0]}"
}

case "${1:-}" in
    up) with_lock cmd_up ;;
    down) with_lock cmd_down ;;
    env) cmd_env ;;
    status) cmd_status ;;
    -h | --help | help) usage ;;
    *) usage >&2; exit 2 ;;
esac
