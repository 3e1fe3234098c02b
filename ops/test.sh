#!/usr/bin/env bash
# README command 2: the workspace's tests (and, for CI, the lints).
#
#   ops/test.sh                 cargo test --workspace --all-targets -- --test-threads=2
#   ops/test.sh --lint          first cargo fmt --check, cargo clippy -D warnings, promtool on
#                               the alert rules, their unit tests and both Prometheus configs, and
#                               ops/deploy/validate.sh on the deployment files (also CI=true)
#   ops/test.sh [--lint] [cargo test args...]   replace --workspace --all-targets, e.g.
#                                               ops/test.sh -p allocator --test integration fencing
#   ops/test.sh --chaos         after the tests: a 45 s seeded chaos run that must pass
#                               (ops/chaos.sh --seed 1 --duration 45) and a 30 s negative control
#                               that must be caught (ops/chaos.sh --negative-control: the step
#                               passes when the checker finds the stale-epoch writes), then the
#                               same over two shards, 30 s each (ops/chaos.sh --shards 2, with
#                               the shard and move faults); .ci/run enables it. CHAOS_SEED,
#                               CHAOS_NC_SEED, CHAOS_SHARDS_SEED and CHAOS_SHARDS_NC_SEED change
#                               the seeds.
#   ops/test.sh --fuzz          after the tests: schemathesis against a live router and allocator
#                               with tokens, 30 s each (ops/fuzz.sh; FUZZ_MAX_TIME), and the
#                               cargo-fuzz targets of the auth-file, policy and request parsers,
#                               10 s each (ops/fuzz-targets.sh; FUZZ_TARGET_SECONDS); .ci/run
#                               enables it.
#   ops/test.sh --shards N      after the tests: the router's integration suite again with every
#                               cluster spread over N shards (TESTKIT_SHARDS=N; a test whose
#                               cluster has fewer allocators than N keeps one database); .ci/run
#                               enables it with N=2.
#   ops/test.sh --restore-drill after the tests: the backup (pgBackRest) and point-in-time
#                               restore drill on a small private cluster, ending with services on
#                               the copy (ops/restore.sh --drill, under a minute); .ci/run enables it.
#
# The test run includes a few seconds of the load tool (loadtest/tests/smoke.rs: closed loop with
# orders and expiring holds, then open loop at 40/s, against a real allocator and router on the
# tests' private PostgreSQL); it fails when the tool's invariant checks fail.
# The integration tests start private PostgreSQL and Redis servers, so the PostgreSQL server
# binaries and redis-server are installed when missing (apt-get, as root), and so are Patroni and
# etcd (the allocator's Patroni failover tests), PgBouncer, pgBackRest, Chromium
# and chromedriver (Debian's chromium, chromium-driver) for the router's operations-page test. Every step runs even
# when an earlier one failed; the exit status is the first failure's.
#
# Knobs: TEST_THREADS (2), TEST_RUNNER (cargo | nextest; default cargo), TEST_BUDGET_SECONDS
# (whole-run deadline, default 2650 when CI=true, under the 45 minutes CI allows; none otherwise;
# CI=true also adds --no-fail-fast so one run reports every failing test binary), ALLOCATOR_PG_BIN,
# ALLOCATOR_REDIS_SERVER, ALLOCATOR_PROMETHEUS_BIN (exported to the tests; found automatically),
# OPS_NO_INSTALL=1.
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

lint=0
chaos=0
fuzz=0
restore_drill=0
shards=0
[[ "${CI:-}" == true || "${CI:-}" == 1 ]] && lint=1
cargo_args=()
for arg in "$@"; do
    case "$arg" in
        --lint) lint=1 ;;
        --no-lint) lint=0 ;;
        --chaos) chaos=1 ;;
        --fuzz) fuzz=1 ;;
        --restore-drill) restore_drill=1 ;;
        --shards) shards=next ;;
        --shards=*) shards="${arg#--shards=}" ;;
        -h | --help) print_header_usage "${BASH_SOURCE[0]}"; exit 0 ;;
        *)
            if [[ "$shards" == next ]]; then
                shards="$arg"
            else
                cargo_args+=("$arg")
            fi
            ;;
    esac
done
[[ "$shards" =~ ^[0-9]+$ ]] || die "--shards takes a shard count, e.g. --shards 2"

THREADS="${TEST_THREADS:-2}"
# In CI every test binary runs even after one fails, so one run reports every failure.
fail_fast=()
RUNNER="${TEST_RUNNER:-cargo}"
if [[ "${CI:-}" == true || "${CI:-}" == 1 ]]; then
    BUDGET="${TEST_BUDGET_SECONDS:-2650}"
    # Clean CI builds: no incremental cache, and only line tables as debug info (backtraces keep
    # file:line) so the test build compiles and links faster on 2 cores.
    export CARGO_INCREMENTAL=0 CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
    export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}"
    fail_fast=(--no-fail-fast)
else
    BUDGET="${TEST_BUDGET_SECONDS:-0}"
fi
[[ "$THREADS" =~ ^[1-9][0-9]*$ ]] || die "TEST_THREADS must be a positive integer"
[[ "$BUDGET" =~ ^[0-9]+$ ]] || die "TEST_BUDGET_SECONDS must be a number of seconds"

cd "$REPO_ROOT"

step "packages (PostgreSQL server, redis-server, libfaketime, Patroni + etcd, PgBouncer, pgBackRest, Chromium + chromedriver)"
ensure_packages postgresql redis faketime curl jq patroni etcd pgbouncer pgbackrest
# The operations page's test drives a headless Chromium. In CI it must run, so a failed install
# fails here; elsewhere the test skips itself (with a message) when the browser is missing.
if [[ "${CI:-}" == true || "${CI:-}" == 1 ]]; then
    ensure_packages chromium
else
    (ensure_packages chromium) || warn "no chromium/chromedriver: the browser test will be skipped"
fi
ALLOCATOR_LIBFAKETIME="$(libfaketime_path)" || die "no libfaketime"
export ALLOCATOR_LIBFAKETIME
ALLOCATOR_PG_BIN="$(pg_bin_dir)" || die "no PostgreSQL server binaries"
ALLOCATOR_REDIS_SERVER="$(redis_server_bin)" || die "no redis-server"
export ALLOCATOR_PG_BIN ALLOCATOR_REDIS_SERVER
info "ALLOCATOR_PG_BIN=$ALLOCATOR_PG_BIN ALLOCATOR_REDIS_SERVER=$ALLOCATOR_REDIS_SERVER"
command -v cargo >/dev/null 2>&1 || die "cargo not found (install Rust with rustup)"
# Each test may run a PostgreSQL, a Redis and several services; lift the fd limit if allowed.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

first_rc=0
failed=()
# run NAME CMD...: runs a step within what is left of the budget, records its result.
run() {
    local name=$1 rc=0 left=0
    shift
    step "$name: $*"
    local t0=$SECONDS
    if ((BUDGET > 0)); then
        left=$((BUDGET - SECONDS))
        if ((left <= 0)); then
            err "$name: no time left in TEST_BUDGET_SECONDS=$BUDGET"
            rc=124
        else
            timeout --kill-after=30 "$left" "$@" </dev/null || rc=$?
            ((rc == 124)) && err "$name: timed out (budget TEST_BUDGET_SECONDS=$BUDGET exhausted)"
        fi
    else
        "$@" </dev/null || rc=$?
    fi
    if ((rc == 0)); then
        ok "$name passed ($((SECONDS - t0))s)"
    else
        err "$name failed with exit $rc ($((SECONDS - t0))s)"
        failed+=("$name")
        ((first_rc)) || first_rc=$rc
    fi
}

if ((lint)); then
    cargo fmt --version >/dev/null 2>&1 || die "rustfmt missing: rustup component add rustfmt"
    cargo clippy --version >/dev/null 2>&1 || die "clippy missing: rustup component add clippy"
    fmt_args=(--check)
    [[ -t 1 ]] || fmt_args+=(--color never)
    run fmt cargo fmt --all -- "${fmt_args[@]}"
    run clippy cargo clippy --workspace --all-targets -- -D warnings
    if promtool="$(promtool_bin)"; then
        run alert-rules "$promtool" check rules ops/prometheus/alerts.yml
        run alert-tests "$promtool" test rules ops/prometheus/alerts_test.yml
        # check config also loads and checks the rule files each config names.
        run prometheus-config "$promtool" check config ops/prometheus/prometheus.yml
        run deploy-prometheus-config "$promtool" check config ops/deploy/prometheus/prometheus.yml \
            ops/deploy/prometheus/kubernetes.yml
    else
        run alert-rules false
    fi
    if validators="$(validators_venv)"; then
        run deploy-manifests ops/deploy/validate.sh "$validators"
    else
        run deploy-manifests false
    fi
fi

# The Prometheus scrape test (router/tests/integration/prometheus.rs) runs a real Prometheus
# server from the same Debian package as promtool; without it that test skips (fails in CI).
if prometheus="$(prometheus_bin)"; then
    export ALLOCATOR_PROMETHEUS_BIN="$prometheus"
    info "ALLOCATOR_PROMETHEUS_BIN=$ALLOCATOR_PROMETHEUS_BIN"
else
    warn "no Prometheus server binary: the Prometheus scrape test will skip (and fail with CI=true)"
fi

case "$RUNNER" in
    cargo)
        if ((${#cargo_args[@]})); then
            run tests cargo test "${fail_fast[@]}" "${cargo_args[@]}" -- --test-threads="$THREADS"
        else
            run tests cargo test "${fail_fast[@]}" --workspace --all-targets -- --test-threads="$THREADS"
        fi
        ;;
    nextest)
        cargo nextest --version >/dev/null 2>&1 || die "TEST_RUNNER=nextest but cargo-nextest is not installed"
        ((${#cargo_args[@]})) || cargo_args=(--workspace --all-targets)
        run tests cargo nextest run "${fail_fast[@]}" --test-threads="$THREADS" "${cargo_args[@]}"
        ;;
    *) die "TEST_RUNNER must be cargo or nextest, got '$RUNNER'" ;;
esac

if ((shards > 1)); then
    # The router's suite again over several shards, less the modules whose subject is the HTTP
    # edge, the page, the documents or one database's failover, which the shard count does not
    # touch (they ran above): routing, orders, ids, holds, history, hand-offs and the shard
    # modules run again.
    over_shards_skip=()
    for module in auth encoded_paths failover failover_redis hostile_input in_flight openapi \
        pooling prometheus request_id stages storage_failover tenants tls ui; do
        over_shards_skip+=(--skip "$module::")
    done
    case "$RUNNER" in
        nextest) run "router-over-$shards-shards" env TESTKIT_SHARDS="$shards" cargo nextest run "${fail_fast[@]}" --test-threads="$THREADS" -p router --test integration -- "${over_shards_skip[@]}" ;;
        *) run "router-over-$shards-shards" env TESTKIT_SHARDS="$shards" cargo test "${fail_fast[@]}" -p router --test integration -- --test-threads="$THREADS" "${over_shards_skip[@]}" ;;
    esac
fi

if ((chaos)); then
    run chaos ops/chaos.sh --seed "${CHAOS_SEED:-1}" --duration 45
    # Exit 1 with the checker's stale-epoch findings is the expected failure; 3 means the broken
    # build went unnoticed, 2 that the run itself failed.
    # shellcheck disable=SC2016 # expanded by the inner shell
    run chaos-negative-control bash -c 'rc=0; ops/chaos.sh --negative-control --seed "$1" --duration 30 || rc=$?; ((rc == 1))' _ "${CHAOS_NC_SEED:-2}"
    # The same over two shards: the shard and move faults, the lease samples and their rules.
    run chaos-shards ops/chaos.sh --shards 2 --seed "${CHAOS_SHARDS_SEED:-3}" --duration 30
    # shellcheck disable=SC2016 # expanded by the inner shell
    run chaos-shards-negative-control bash -c 'rc=0; ops/chaos.sh --shards 2 --negative-control --seed "$1" --duration 30 || rc=$?; ((rc == 1))' _ "${CHAOS_SHARDS_NC_SEED:-2}"
fi

if ((restore_drill)); then
    run restore-drill ops/restore.sh --drill
fi

if ((fuzz)); then
    FUZZ_SKIP_BUILD=1 run fuzz ops/fuzz.sh --max-time "${FUZZ_MAX_TIME:-30}"
    run fuzz-targets ops/fuzz-targets.sh --seconds "${FUZZ_TARGET_SECONDS:-10}"
fi

echo >&2
if ((${#failed[@]})); then
    err "failed: ${failed[*]} (total ${SECONDS}s)"
    exit "$first_rc"
fi
ok "all passed (total ${SECONDS}s)"
