# shellcheck shell=bash
# The profile of ops/bench.sh --profile: where the CPU of an open-loop row goes, process by process
# and function by function, beside what PostgreSQL spent on each statement. Source it from
# ops/bench.sh; do not run it.
#
#   profile_begin NAME    pg_stat_statements reset, then `perf record -g -a` (every process, call
#                         graphs, PROFILE_FREQ samples a second) until profile_end
#   profile_end NAME      stop perf; write $BENCH_DIR/NAME.profile.md: the samples' share per
#                         process (postgres backends together; the allocator, the router and the
#                         load generator by pid), each one's top functions (self time), and
#                         PostgreSQL's top statements (calls, mean and total execution time, rows
#                         per call)
#   profile_report        every written profile on stdout
#
# perf samples the CPU clock (the hardware counters are not there on every machine), so a share
# is of the CPU the row used, not of wall time: what the stage table cannot show (time waiting
# is not CPU), this shows.

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    echo "ops/bench/profile.sh holds the profile of ops/bench.sh --profile; source it, do not run it" >&2
    exit 2
fi

PROFILE_FREQ="${PROFILE_FREQ:-499}"
PROFILE_PERF=""
PROFILES=()

profile_begin() {
    command -v perf >/dev/null 2>&1 || die "--profile needs perf (apt-get install linux-perf)"
    psql_db -At "$DATABASE_URL" -c "SELECT pg_stat_statements_reset()" >/dev/null
    perf record -F "$PROFILE_FREQ" -g -a -o "$BENCH_DIR/$1.perf.data" >"$BENCH_DIR/$1.perf.log" 2>&1 &
    PROFILE_PERF=$!
    sleep 0.5
}

# profile_top TITLE FILTER...: the top functions by self time of the samples FILTER selects.
profile_top() {
    local title=$1 data=$2
    shift 2
    printf '\n%s, top functions (self, share of its samples):\n\n```\n' "$title"
    perf report -i "$data" "$@" --no-children --percentage relative --sort dso,sym --stdio -g none --percent-limit 1.5 \
        2>/dev/null | grep -E '^ +[0-9]' | head -n 15 || true
    printf '```\n'
}

profile_end() {
    local name=$1 data="$BENCH_DIR/$1.perf.data" out="$BENCH_DIR/$1.profile.md"
    [[ -n "$PROFILE_PERF" ]] || return 0
    kill -INT "$PROFILE_PERF" 2>/dev/null || true
    wait "$PROFILE_PERF" 2>/dev/null || true
    PROFILE_PERF=""
    {
        printf '### Profile: %s\n\nCPU samples per process (`perf record -F %s -g -a`):\n\n' "$name" "$PROFILE_FREQ"
        printf '| process | share of all samples |\n| --- | --- |\n'
        perf script -i "$data" -F comm,pid 2>/dev/null | awk -v a="$ALLOC_PID" -v r="$ROUTER_PID" '
            {
                pid = $NF; comm = $1; n++
                if (pid == a) who = "allocator"; else if (pid == r) who = "router"
                else if (comm == "postgres") who = "postgres (every backend)"
                else if (comm ~ /^loadtest|^tokio|^pgbench/) who = "load generator"
                else who = "other (not the row'"'"'s processes)"
                count[who]++
            }
            END { for (w in count) printf "| %s | %.1f %% |\n", w, 100 * count[w] / n }' | sort -t'|' -k3 -rn || true
        profile_top "allocator (pid $ALLOC_PID)" "$data" --pid "$ALLOC_PID"
        profile_top "router (pid $ROUTER_PID)" "$data" --pid "$ROUTER_PID"
        profile_top "postgres backends" "$data" --comm postgres
        printf '\nPostgreSQL, top statements by total execution time (pg_stat_statements):\n\n'
        printf '| calls | mean ms | total ms | rows/call | statement |\n| --- | --- | --- | --- | --- |\n'
        psql_db -At -F $'\t' "$DATABASE_URL" -c "
            SELECT calls, round(mean_exec_time::numeric, 3), round(total_exec_time::numeric, 1),
                   round(rows::numeric / greatest(calls, 1), 2),
                   left(regexp_replace(query, '\s+', ' ', 'g'), 90)
              FROM pg_stat_statements WHERE calls > 10
             ORDER BY total_exec_time DESC LIMIT 8" |
            awk -F'\t' '{ gsub(/\|/, "\\|", $5); printf "| %s | %s | %s | %s | `%s` |\n", $1, $2, $3, $4, $5 }' || true
    } >"$out"
    PROFILES+=("$out")
}

profile_report() {
    local f
    for f in "${PROFILES[@]}"; do
        printf '\n'
        cat "$f"
    done
}
