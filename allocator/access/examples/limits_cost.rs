//! What admitting one request through the per-client limits costs, against the hand-written
//! token bucket `ClientLimits` used before it (kept below as the baseline), in one run:
//!
//! ```text
//! cargo run --release -p access --example limits_cost [-- ADMITS_PER_THREAD]
//! ```
//!
//! Each of 1 and 2 threads admits requests of 8 clients in turn with a rate and an in-flight cap
//! that never refuse, and once more with a rate that refuses nearly every request (the `429`
//! path). Printed: nanoseconds per admission for both, and their ratio.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use access::limits::ClientLimits;

const CLIENTS: [&str; 8] = ["a", "b", "c", "d", "e", "f", "g", "h"];

/// The per-client limits as they were written by hand: a mutex over a map of f64 token buckets
/// refilled from the instant the caller passes in.
#[derive(Default)]
struct Baseline {
    clients: Mutex<HashMap<String, Entry>>,
}

/// (rate, burst, tokens, updated) and the in-flight counter.
type Entry = (Option<(f64, f64, f64, Instant)>, Arc<AtomicUsize>);

struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Baseline {
    fn admit(&self, client: &str, rate: (f64, u32), limit: usize, now: Instant) -> Option<Slot> {
        let mut clients = self.clients.lock().unwrap();
        let (bucket, counter) = clients.entry(client.to_owned()).or_default();
        let before = counter.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(counter.clone());
        if before >= limit {
            return None;
        }
        let (per_sec, burst) = (rate.0, f64::from(rate.1));
        let (r, b, tokens, updated) = bucket.get_or_insert((per_sec, burst, burst, now));
        let elapsed = now.saturating_duration_since(*updated).as_secs_f64();
        *tokens = (*tokens + elapsed * *r).min(*b);
        if now > *updated {
            *updated = now;
        }
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Some(slot)
        } else {
            black_box(Duration::from_secs_f64((1.0 - *tokens) / *r));
            None
        }
    }
}

/// Nanoseconds per call of `admit` over `threads` threads doing `n` calls each.
fn time(threads: usize, n: usize, admit: impl Fn(&str) -> bool + Sync) -> f64 {
    let started = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let admit = &admit;
            scope.spawn(move || {
                let mut admitted = 0usize;
                for i in 0..n {
                    admitted += usize::from(admit(CLIENTS[(i + t) % CLIENTS.len()]));
                }
                black_box(admitted);
            });
        }
    });
    started.elapsed().as_nanos() as f64 / (threads * n) as f64
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    println!("admissions per thread: {n}");
    println!(
        "{:<28} {:>12} {:>12} {:>8}",
        "case", "baseline ns", "governor ns", "ratio"
    );
    for (case, rate) in [("admitted", (1e9, 1_000_000)), ("refused (rate)", (1.0, 1))] {
        for threads in [1, 2] {
            let baseline = Baseline::default();
            let old = time(threads, n, |c| {
                baseline.admit(c, rate, 64, Instant::now()).is_some()
            });
            let limits = ClientLimits::default();
            let new = time(threads, n, |c| {
                limits.admit(c, Some(rate), Some(64)).is_ok()
            });
            println!(
                "{:<28} {old:>12.1} {new:>12.1} {:>8.2}",
                format!("{case}, {threads} thread(s)"),
                new / old
            );
        }
    }
}
