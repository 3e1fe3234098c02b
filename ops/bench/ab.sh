# The A/B modes of ops/bench.sh (--compare DIR, --relay), sourced by it after its row functions:
# two clusters ("baseline" and "cluster", the current one), BENCH_ROUNDS rounds alternating them
# on the same rows, one table of both with the ratios (ops/bench/compare.awk). Uses bench.sh's
# globals and functions (start_cluster, use_cluster, loadtest_row, psql_db, ...).

# ab_watch_more STATE (--shards): the further shards' servers and allocators of the cluster in
# STATE, watched as postgres-sN and allocator-N (summed with the first ones in every row), and
# SHARD_LIST, the cluster's shards as NAME=URL.
ab_watch_more() {
    local file pid name
    for file in "$1"/run/postgres-s*.pid "$1"/run/alloc-[2-9]*.pid; do
        [[ -f "$file" ]] || continue
        pid="$(head -n1 "$file")"
        pid_alive "$pid" || die "${file##*/} is not running"
        name="$(basename "$file" .pid)"
        case "$name" in
            postgres-*) WATCH+=("$name=$pid") ;;
            alloc-*) WATCH+=("allocator-${name#alloc-}=$pid") ;;
        esac
    done
    read -r -a SHARD_LIST <<<"${SHARD_URLS:-}"
}

# ab_seed_shards PREFIX SKUS: bench.sh's seed on a cluster of several shards: each SKU into the
# shard the catalog's map (the first shard's `shard_map`) names for its partition.
ab_seed_shards() {
    local rows="$BENCH_DIR/seed.csv" map="$BENCH_DIR/shard_map.csv" entry
    "$LOADTEST" partitions --prefix "$1" --skus "$2" --partitions "$PARTITIONS" >"$rows"
    psql_db -At -F, "${SHARD_LIST[0]#*=}" -c "SELECT partition, shard FROM shard_map" >"$map"
    for entry in "${SHARD_LIST[@]}"; do
        awk -F, -v s="${entry%%=*}" 'NR == FNR { if ($2 == s) mine[$1] = 1; next } $2 in mine' "$map" "$rows" \
            | psql_db "${entry#*=}" -v stock="$STOCK" -f "$BENCH_SQL/seed.sql" >/dev/null
    done
}

# ab_pgbouncer_start (--pgbouncer): PgBouncer in session mode in front of the baseline cluster's
# PostgreSQL, as the database's OS user, and a database of its own there; sets BOUNCER_URL,
# BOUNCER_PID and BOUNCED_PG_PID (the server, for the current cluster's CPU column).
ab_pgbouncer_start() {
    local dir="$BENCH_DIR/pgbouncer" port
    port="$(free_port)"
    mkdir -p "$dir"
    "$PG_BIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres allocator_bounced
    printf '"postgres" ""\n' >"$dir/users.txt"
    printf '%s\n' "[databases]" "* = host=127.0.0.1 port=$PG_PORT" "[pgbouncer]" \
        "listen_addr = 127.0.0.1" "listen_port = $port" "unix_socket_dir =" "auth_type = trust" \
        "auth_file = $dir/users.txt" "pool_mode = session" "default_pool_size = 200" \
        "max_client_conn = 1000" "logfile = $dir/pgbouncer.log" "pidfile = $dir/pgbouncer.pid" \
        >"$dir/pgbouncer.ini"
    is_root && chown -R postgres "$dir"
    as_pg_user pgbouncer -d "$dir/pgbouncer.ini" || die "PgBouncer did not start (log $dir/pgbouncer.log)"
    sleep 0.5
    BOUNCER_PID="$(head -n1 "$dir/pgbouncer.pid")" || die "no PgBouncer pid"
    BOUNCED_PG_PID=$PG_PID
    BOUNCER_URL="postgres://postgres@127.0.0.1:$port/allocator_bounced"
    info "PgBouncer (session mode) on 127.0.0.1:$port, pid $BOUNCER_PID, in front of PostgreSQL pid $PG_PID"
}

# ab_run: runs the rounds, prints the table and exits with the rows' status.
ab_run() {
    CURRENT_LOADTEST=$LOADTEST
    if [[ -n "$RELAY" ]]; then
        start_cluster baseline "$ALLOCATOR_BIN" "$ROUTER_BIN"
        BASE_LOADTEST=$LOADTEST
        NAMES="relay off,relay on"
        ABOUT="The change-event relay off (baseline) and on (current), same build"
    elif [[ -n "$PGBOUNCER" ]]; then
        use_cluster baseline
        BASE_LOADTEST=$LOADTEST
        NAMES="direct,PgBouncer"
        ABOUT="Sessions direct to PostgreSQL (baseline) and through PgBouncer 1.18 in session mode (current; its CPU in the PostgreSQL column), same build and server"
    elif [[ -n "$SHARDS_AB" ]]; then
        BENCH_ALLOCATORS=2 start_cluster baseline "$ALLOCATOR_BIN" "$ROUTER_BIN"
        BASE_LOADTEST=$LOADTEST
        NAMES="1 shard,2 shards"
        ABOUT="Partitions on one PostgreSQL primary (baseline) and on two (current), same build, 2 allocators each"
    else
        start_cluster baseline "$COMPARE/allocator" "$COMPARE/router"
        BASE_LOADTEST="$COMPARE/loadtest"
        NAMES="baseline,current"
        ABOUT="Baseline $COMPARE against the current build"
    fi
    for ((round = 1; round <= ROUNDS; round++)); do
        for VARIANT in baseline current; do
            use_cluster "$([[ $VARIANT == current ]] && echo cluster || echo baseline)"
            LOADTEST="$([[ $VARIANT == current ]] && echo "$CURRENT_LOADTEST" || echo "$BASE_LOADTEST")"
            step "round $round, $VARIANT"
            # Over several shards only routed rows: one allocator serves only its own shard.
            if [[ -n "$SHARDS_AB" || "${BENCH_SHARDS:-1}" -gt 1 ]]; then
                loadtest_row router zipf
                loadtest_row router uniform
                loadtest_row router zipf open "$COMPARE_RATE"
                continue
            fi
            if [[ -n "$RELAY" ]]; then
                loadtest_row allocator hot
                loadtest_row router hot
                loadtest_row allocator zipf
            else
                loadtest_row allocator uniform
            fi
            loadtest_row router zipf
            loadtest_row allocator zipf open "$COMPARE_RATE"
            loadtest_row router zipf open "$COMPARE_RATE"
        done
    done
    TABLE="$BENCH_DIR/compare.md"
    {
        echo "$ABOUT, $ROUNDS rounds alternating, ${DURATION}s per row,"
        if [[ -n "$SHARDS_AB" || "${BENCH_SHARDS:-1}" -gt 1 ]]; then
            echo "each on its own cluster (durable private PostgreSQL per shard, ${BENCH_ALLOCATORS:-2} allocators, 1 router, $PARTITIONS partitions)."
        else
            echo "each on its own cluster (durable private PostgreSQL, 1 allocator, 1 router, $PARTITIONS partitions)."
        fi
        if [[ -n "$RELAY" ]]; then
            use_cluster cluster
            echo
            psql_db -At "$DATABASE_URL" -c "SELECT 'Relay at the end: ' || sum(p.published) || ' events published, '
                || coalesce(sum(greatest(h.head - p.published, 0)), 0) || ' still to publish.'
                FROM event_relay_progress p LEFT JOIN (SELECT 'partition/' || partition AS stream,
                last_position AS head FROM ledger_positions) h USING (stream)"
        fi
        echo
        awk -F'\t' -v skus="$SKUS" -v names="$NAMES" -f "$BENCH_SQL/compare.awk" "$RESULTS"
    } >"$TABLE"
    echo
    cat "$TABLE"
    info "comparison done in $((SECONDS - START))s (build excluded); reports in ${BENCH_DIR#"$REPO_ROOT"/}"
    exit "$FAILED"
}
