# The Markdown table and the targets of ops/bench.sh, from its results.tsv (tab-separated):
#   1 system (pgbench|allocator|router|redis)  2 label  3 workload (uniform|zipf|hot)  4 load
#   5 open-loop fraction of the routed peak ("-": closed loop)  6 throughput /s  7-9 p50 p99 p99.9
#   ms  10-13 CPU µs per operation: PostgreSQL, allocator, router, load generator ("-": none)
#   14 invariants  15 notes
# Variable: skus (the spread workloads' SKU count).

function workload(w) {
    if (w == "uniform") return "uniform over " skus " SKUs"
    if (w == "zipf") return "zipf:1.1 over " skus " SKUs"
    if (w == "hot") return "1 hot SKU"
    return w
}
function num(x) { return x ~ /^[0-9.]+$/ }
function us(x) { return num(x) ? sprintf("%.1f", x) : "-" }
function ratio(a, b) { return (num(a) && num(b) && b > 0) ? a / b : -1 }
function x(r) { return r < 0 ? "-" : sprintf("%.2fx", r) }
function verdict(ok) { return ok ? "met" : "**missed**" }

{
    n++
    for (i = 1; i <= 15; i++) f[n, i] = $i
    key = $1 "|" $3 "|" $5
    tput[key] = $6; p50[key] = $7; p99[key] = $8
    pg[key] = $10; al[key] = $11; ro[key] = $12
    if ($5 != "-" && !($5 in seen)) { seen[$5] = 1; fracs[++nf] = $5 }
}

END {
    print "| system | workload | load | /s | p50 ms | p99 ms | p99.9 ms | vs naive | PostgreSQL µs/op | allocator µs/op | router µs/op | load generator µs/op | invariants | notes |"
    print "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"
    for (r = 1; r <= n; r++) {
        sys = f[r, 1]; w = f[r, 3]; frac = f[r, 5]
        if (frac == "-") {
            base = "pgbench|" (w == "hot" ? "hot" : "uniform") "|-"
            vs = x(ratio(f[r, 6], tput[base]))
        } else {
            base = "pgbench|" w "|" frac
            a = ratio(f[r, 7], p50[base]); b = ratio(f[r, 8], p99[base])
            vs = (a < 0 || b < 0) ? "-" : sprintf("p50 %.2fx, p99 %.2fx", a, b)
        }
        tp = num(f[r, 6]) ? sprintf("%.0f", f[r, 6]) : f[r, 6]
        printf "| %s | %s | %s | %s | %.2f | %.2f | %.2f | %s | %s | %s | %s | %s | %s | %s |\n",
            f[r, 2], workload(w), f[r, 4], tp, f[r, 7], f[r, 8], f[r, 9], vs,
            us(f[r, 10]), us(f[r, 11]), us(f[r, 12]), us(f[r, 13]), f[r, 14], f[r, 15]
    }
    print ""
    print "Closed-loop ratios: throughput against pgbench's (hot rows against pgbench hot, spread rows"
    print "against pgbench uniform). Open-loop ratios: p50 and p99 against pgbench at the same offered"
    print "rate; latency counts from each request's intended start. CPU per operation from /proc over"
    print "the row's load: PostgreSQL is the postmaster with all its backends; the allocator and the"
    print "router are counted on every row (idle on the pgbench rows); the load generator is loadtest or"
    print "pgbench. allocator/router rows are reserves through the HTTP API, each a fenced transaction"
    print "with its reservation and ledger rows; pgbench and redis rows are single statements / scripts."
    print ""
    print "Targets (this invocation):"
    print ""
    u = "allocator|uniform|-"; nu = "pgbench|uniform|-"
    if (num(pg[u]) && num(pg[nu]))
        printf "- PostgreSQL CPU per spread reserve below the naive statement's: %s µs (uniform, direct) vs %s µs per naive transaction: %s\n", us(pg[u]), us(pg[nu]), verdict(pg[u] + 0 < pg[nu] + 0)
    for (k = 1; k <= 2; k++) {
        sys = (k == 1) ? "allocator" : "router"
        for (j = 1; j <= nf; j++) {
            frac = fracs[j]; key = sys "|zipf|" frac; nb = "pgbench|zipf|" frac
            if (!(key in p50)) continue
            if (frac + 0 == 0.25) {
                limit = (sys == "allocator") ? 10 : 12
                a = ratio(p50[key], p50[nb])
                printf "- %s at 25 %% of the routed peak: p50 %.2f ms = %s naive (target ≤ 2x): %s; p99 %.2f ms (target ≤ %d ms): %s\n", (sys == "allocator" ? "direct" : "routed"), p50[key], x(a), verdict(a >= 0 && a <= 2), p99[key], limit, verdict(p99[key] + 0 <= limit)
            }
            if (frac + 0 == 0.5 && sys == "router")
                printf "- routed at 50 %% of the routed peak: p99 %.2f ms (target ≤ 25 ms): %s\n", p99[key], verdict(p99[key] + 0 <= 25)
        }
    }
    for (k = 1; k <= 2; k++) {
        sys = (k == 1) ? "allocator" : "router"
        a = ratio(tput[sys "|hot|-"], tput["pgbench|hot|-"])
        if (a >= 0) printf "- one hot SKU, %s: %s naive (target ≥ 10x): %s\n", (k == 1 ? "direct" : "routed"), x(a), verdict(a >= 10)
    }
    a = ratio(tput["router|zipf|-"], tput[nu])
    if (a >= 0) printf "- zipf via the router: %s naive uniform (target ≥ 0.7x, stretch 1x): %s\n", x(a), verdict(a >= 0.7)
    if (num(al[u])) printf "- allocator CPU per request: %s µs (uniform, direct; target ≤ 30 µs): %s\n", us(al[u]), verdict(al[u] + 0 <= 30)
    z = "router|zipf|-"
    if (num(ro[z])) printf "- router CPU per request: %s µs (zipf, routed; target ≤ 25 µs): %s\n", us(ro[z]), verdict(ro[z] + 0 <= 25)
}
