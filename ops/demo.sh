#!/usr/bin/env bash
# The API walkthrough against a running local cluster (ops/cluster.sh demo): restock, reserve,
# replay, out-of-stock, confirm, release, a multi-line order; exits 1 when an answer differs from
# what the contract says.
#
#   ops/demo.sh    against the first ready router of the cluster in CLUSTER_DIR (.cluster), or
#                  CLUSTER_DEMO_URL; CLUSTER_TOKEN is sent as a bearer token when set
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

RUN_DIR="$CLUSTER_DIR/run"

proc_url() { cat "$RUN_DIR/$1.url" 2>/dev/null; }

# Names of recorded routers, in numeric order.
proc_names() {
    local kind=$1 f
    for f in "$RUN_DIR/$kind"-*.pid; do
        [[ -e "$f" ]] || continue
        basename "$f" .pid
    done | sort -t- -k2,2n
}

# The optional bearer token as curl arguments (empty without CLUSTER_TOKEN).
auth_args() { [[ -n "${CLUSTER_TOKEN:-}" ]] && printf '%s\n' -H "authorization: Bearer $CLUSTER_TOKEN"; return 0; }

# --- demo ----------------------------------------------------------------------------------------

DEMO_FAILS=0

# req METHOD PATH BODY EXPECT: one request to the router, printed compactly. EXPECT is a status
# (201), a class (2xx) or a list (200|201). Retries 503 and connection errors a few times with the
# same body (every request here is idempotent). Sets RESP_CODE, RESP_BODY, RESP_HEADERS.
req() {
    local method=$1 path=$2 body=$3 expect=$4 attempt hdr bodyf
    hdr="$(mktemp)" bodyf="$(mktemp)"
    printf '%s %s' "$method" "$path"
    [[ -n "$body" ]] && printf '  %s' "$body"
    printf '\n'
    local args=(-sS -X "$method" -D "$hdr" -o "$bodyf" -w '%{http_code}' --max-time 15)
    [[ -n "$body" ]] && args+=(-H 'content-type: application/json' --data "$body")
    local auth=()
    mapfile -t auth < <(auth_args)
    args+=("${auth[@]}")
    for attempt in 1 2 3 4 5 6 7 8 9 10; do
        RESP_CODE="$(curl "${args[@]}" "$DEMO_URL$path" 2>/dev/null)" || true
        [[ "$RESP_CODE" =~ ^(000|503)$ ]] || break
        printf '  .. %s, retrying with the same request (%d)\n' "$RESP_CODE" "$attempt"
        sleep 1
    done
    RESP_HEADERS="$(tr -d '\r' <"$hdr")"
    RESP_BODY="$(jq -c . <"$bodyf" 2>/dev/null || cat "$bodyf")"
    rm -f "$hdr" "$bodyf"
    local shown="" h
    for h in idempotent-replayed retry-after content-type; do
        local v
        v="$(grep -i "^$h:" <<<"$RESP_HEADERS" | tail -n1 | cut -d: -f2- | sed 's/^ *//')" || true
        [[ "$h" == content-type && "$v" != *problem* ]] && continue
        [[ -n "$v" ]] && shown+="  [$h: $v]"
    done
    local verdict=ok
    if ! [[ "$RESP_CODE" =~ ^(${expect//x/[0-9]})$ ]]; then
        verdict="UNEXPECTED (wanted $expect)"
        DEMO_FAILS=$((DEMO_FAILS + 1))
    fi
    printf '  -> %s%s  %s\n' "$RESP_CODE" "$shown" "$RESP_BODY"
    [[ "$verdict" == ok ]] || printf '  !! %s\n' "$verdict"
}

expect_header() { # name value
    if ! grep -qi "^$1: *$2" <<<"$RESP_HEADERS"; then
        printf '  !! expected header %s: %s\n' "$1" "$2"
        DEMO_FAILS=$((DEMO_FAILS + 1))
    fi
}

expect_json() { # jq-filter description
    if ! jq -e "$1" <<<"$RESP_BODY" >/dev/null 2>&1; then
        printf '  !! expected %s (jq: %s)\n' "$2" "$1"
        DEMO_FAILS=$((DEMO_FAILS + 1))
    fi
}

note() { printf '\n# %s\n' "$*"; }

cmd_demo() {
    command -v jq >/dev/null 2>&1 || die "jq is required for the demo (apt-get install -y jq)"
    DEMO_URL="${CLUSTER_DEMO_URL:-}"
    if [[ -z "$DEMO_URL" ]]; then
        local name
        for name in $(proc_names router); do
            DEMO_URL="$(proc_url "$name")"
            [[ "$(http_status "$DEMO_URL/readyz")" == 200 ]] && break
            DEMO_URL=""
        done
    fi
    [[ -n "$DEMO_URL" ]] || die "no ready router; run ops/cluster.sh up first (or set CLUSTER_DEMO_URL)"
    local run r1 r2 r3 avail
    run="demo-$(date +%H%M%S)-$$"
    r1="$run-r1" r2="$run-r2" r3="$run-r3"
    echo "demo against router $DEMO_URL (ids prefixed $run)"

    note "restock: the first adjustment creates the SKU"
    req POST /v1/inventory/demo-widget/adjustments "{\"adjustment_id\":\"$run-a1\",\"delta\":3}" 2xx
    req POST /v1/inventory/demo-gadget/adjustments "{\"adjustment_id\":\"$run-a2\",\"delta\":10}" 2xx
    req POST /v1/inventory/demo-gizmo/adjustments "{\"adjustment_id\":\"$run-a3\",\"delta\":5}" 2xx
    note "an adjustment retried with the same id is applied once"
    req POST /v1/inventory/demo-widget/adjustments "{\"adjustment_id\":\"$run-a1\",\"delta\":3}" 2xx
    req GET /v1/inventory/demo-widget "" 200
    avail="$(jq -r '.available // empty' <<<"$RESP_BODY")"
    [[ "$avail" =~ ^[0-9]+$ ]] || avail=3

    note "reserve 2 of demo-widget"
    req POST /v1/reservations "{\"reservation_id\":\"$r1\",\"sku\":\"demo-widget\",\"quantity\":2}" 201
    expect_json '.status == "held"' 'status held'
    note "client retry with the same reservation id: original outcome, replayed"
    req POST /v1/reservations "{\"reservation_id\":\"$r1\",\"sku\":\"demo-widget\",\"quantity\":2}" 200
    expect_header Idempotent-Replayed true
    note "ask for more than is left: 409 insufficient-stock (nothing is held)"
    req POST /v1/reservations "{\"reservation_id\":\"$r2\",\"sku\":\"demo-widget\",\"quantity\":$((avail - 2 + 1))}" 409
    expect_json '.type | test("insufficient-stock")' 'problem type insufficient-stock'
    note "reserve the last one"
    req POST /v1/reservations "{\"reservation_id\":\"$r3\",\"sku\":\"demo-widget\",\"quantity\":1,\"ttl_seconds\":600}" 201

    note "confirm the first, release the other"
    req POST "/v1/reservations/$r1/confirm" "" 200
    req POST "/v1/reservations/$r3/release" "" 200
    note "a release after confirm is refused (invalid-state)"
    req POST "/v1/reservations/$r1/release" "" 409
    req GET "/v1/reservations/$r1" "" 200
    expect_json '.status == "confirmed"' 'status confirmed'
    req GET "/v1/reservations/$r3" "" 200
    expect_json '.status == "released"' 'status released'
    req GET /v1/inventory/demo-widget "" 200

    note "multi-line order through the router: all lines or none"
    req POST "/v1/orders/$run-o1/reservations" '{"lines":[{"sku":"demo-gadget","quantity":2},{"sku":"demo-gizmo","quantity":1}]}' '200|201'
    req POST "/v1/orders/$run-o2/reservations" '{"lines":[{"sku":"demo-gadget","quantity":1},{"sku":"demo-gizmo","quantity":999}]}' 409
    req GET /v1/inventory/demo-gadget "" 200
    req GET /v1/inventory/demo-gizmo "" 200

    echo
    if ((DEMO_FAILS)); then
        err "demo: $DEMO_FAILS unexpected answer(s), see '!!' above"
        return 1
    fi
    ok "demo: every answer as specified"
}

case "${1:-}" in
    "") cmd_demo ;;
    -h | --help | help) print_header_usage "${BASH_SOURCE[0]}" ;;
    *) print_header_usage "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
