#!/usr/bin/env bash
# Property-based API fuzz: schemathesis against a live router and a live allocator, generated
# from the document each one serves at /openapi.json, with bearer-token authentication on.
#
#   ops/fuzz.sh                     60 s per service
#   ops/fuzz.sh --max-time 300      longer
#   ops/fuzz.sh --seed N            replay a run (schemathesis prints its seed)
#
# Phases: examples, fuzzing and stateful sequences. The coverage phase is left out: on this
# Python it stops at random with an internal error in hypothesis ("AST constructor recursion
# depth mismatch"), after every case it did run had passed.
# Every check schemathesis has runs (ops/fuzz/schemathesis.toml says which premises differ): no
# answer may be a 5xx, and status, content type, headers and body must conform to the document.
# Starts a private cluster (PostgreSQL, Redis, 1 allocator, 1 router) from the debug binaries
# with fresh tokens, and tears it down. Reports and logs: target/fuzz/ (FUZZ_DIR).
# schemathesis is installed (pinned) into a virtualenv under ~/.cache/allocator-ops.
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MAX_TIME=60
SEED=""
while (($#)); do
    case "$1" in
        --max-time) MAX_TIME="${2:?--max-time needs seconds}"; shift 2 ;;
        --seed) SEED="${2:?--seed needs a number}"; shift 2 ;;
        -h | --help) print_header_usage "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument '$1' (try --help)" ;;
    esac
done
[[ "$MAX_TIME" =~ ^[1-9][0-9]*$ ]] || die "--max-time must be a positive number of seconds"

SCHEMATHESIS_VERSION=4.32.5
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
FUZZ_DIR="${FUZZ_DIR:-$TARGET_DIR/fuzz}"
rm -rf "$FUZZ_DIR"
mkdir -p "$FUZZ_DIR"

step "schemathesis $SCHEMATHESIS_VERSION"
venv="${XDG_CACHE_HOME:-$HOME/.cache}/allocator-ops/schemathesis-$SCHEMATHESIS_VERSION"
if [[ ! -x "$venv/bin/schemathesis" ]]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    quiet "$venv/bin/pip" install --disable-pip-version-check -q "schemathesis==$SCHEMATHESIS_VERSION"
fi
st="$venv/bin/schemathesis"

step "binaries (debug)"
if [[ -z "${FUZZ_SKIP_BUILD:-}" ]]; then
    cargo build -q -p allocator -p router --bins
fi

# Fresh tokens: a client with every scope for the fuzzer, and the router's credential towards
# the allocators. Only their SHA-256 digests go into the auth files.
auth_dir="$FUZZ_DIR/auth"
mkdir -p "$auth_dir"
chmod 700 "$auth_dir"
random_token() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }
sha256_hex() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
client_token="$(random_token)"
router_token="$(random_token)"
(
    umask 077
    printf '%s\n' "$router_token" >"$auth_dir/router.token"
    printf 'fuzz reserve,admin %s\n' "$(sha256_hex "$client_token")" >"$auth_dir/router-clients"
    printf 'routers router %s\nfuzz reserve,admin %s\n' "$(sha256_hex "$router_token")" \
        "$(sha256_hex "$client_token")" >"$auth_dir/allocator-clients"
)

export CLUSTER_DIR="$FUZZ_DIR/cluster" CLUSTER_PRIVATE=1 CLUSTER_SKIP_BUILD=1
# One allocator owns every partition, so a direct call is never a `421` for a partition owned
# elsewhere (documented, but a refusal of valid input to the fuzzer).
export CLUSTER_ALLOCATORS=1 CLUSTER_ROUTERS=1 CLUSTER_PARTITIONS=8
export CLUSTER_ALLOCATOR_BIN="$TARGET_DIR/debug/allocator" CLUSTER_ROUTER_BIN="$TARGET_DIR/debug/router"
export CLUSTER_ALLOCATOR_ARGS="--auth-file $auth_dir/allocator-clients"
export CLUSTER_ROUTER_ARGS="--auth-file $auth_dir/router-clients --upstream-token-file $auth_dir/router.token"
export CLUSTER_TOKEN="$client_token"
export RUST_LOG="${RUST_LOG:-warn}"
trap '"$OPS_DIR/cluster.sh" down >/dev/null 2>&1 || warn "ops/cluster.sh down failed"' EXIT

step "private cluster"
"$OPS_DIR/cluster.sh" up >"$FUZZ_DIR/cluster-up.log" 2>&1 || {
    tail -n 30 "$FUZZ_DIR/cluster-up.log" >&2
    die "cluster up failed (logs in $CLUSTER_DIR/logs)"
}
# shellcheck source=/dev/null
source "$CLUSTER_DIR/cluster.env"
allocator_url="${ALLOCATOR_URLS%% *}"

# Stock for the examples' SKU so that positive paths reach the database, not only refusals.
curl -sf -o /dev/null -H "authorization: Bearer $client_token" -H 'content-type: application/json' \
    --data '{"adjustment_id":"fuzz-stock","delta":100000}' "$ROUTER_URL/v1/inventory/widget-42/adjustments" ||
    warn "could not stock widget-42"

rc=0
fuzz() {
    local name=$1 url=$2 seed_args=()
    [[ -n "$SEED" ]] && seed_args=(--seed "$SEED")
    step "schemathesis against the $name ($url/openapi.json, ${MAX_TIME}s)"
    local out="$FUZZ_DIR/$name.txt"
    set +e
    (cd "$OPS_DIR/fuzz" && "$st" run "$url/openapi.json" \
        --checks all \
        --phases examples,fuzzing,stateful \
        --max-time "$MAX_TIME" \
        --workers 2 \
        --request-timeout 15 \
        --header "Authorization: Bearer $client_token" \
        --report junit --report-dir "$FUZZ_DIR/$name-report" \
        "${seed_args[@]}") >"$out" 2>&1
    local status=$?
    set -e
    sed -n '/=* SUMMARY =*/,$p' "$out" >&2
    if ((status != 0)); then
        err "schemathesis found problems in the $name (full output: $out)"
        rc=1
    else
        ok "$name: every answer conformed"
    fi
    # Counts for the record: test cases generated and 5xx seen.
    grep -E '^\s*[0-9]+ generated' "$out" >&2 || true
}

fuzz router "$ROUTER_URL"
fuzz allocator "$allocator_url"

# A 5xx would also be in the services' logs as an error; none may be.
if grep -l '"level":"ERROR"' "$CLUSTER_DIR"/logs/*.log 2>/dev/null; then
    warn "error-level log lines during the fuzz run (above files)"
fi
exit "$rc"
