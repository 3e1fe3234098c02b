//! A small log-linear latency histogram (microsecond resolution, mergeable).
//!
//! Values below 128 µs are counted exactly. Above, every power-of-two range `[2^e, 2^(e+1))` is
//! split into 64 equal sub-buckets, so a recorded value is known to within 1/64 (≈1.6 %) of
//! itself. That is the same idea as an HDR histogram with two significant digits, in ~30 KiB,
//! without a dependency. Each worker owns one and they are merged at the end, so recording is a
//! plain array increment with no locking.

use std::time::Duration;

/// Values below this are stored exactly, one bucket each.
const EXACT: u64 = 128;
/// Sub-buckets per power of two above `EXACT`; 64 = 2^6.
const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;
/// log2(EXACT).
const FIRST_EXP: u32 = 7;
const BUCKETS: usize = EXACT as usize + (64 - FIRST_EXP as usize) * SUB as usize;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

/// Index of the bucket holding `value`.
fn bucket_of(value: u64) -> usize {
    if value < EXACT {
        return value as usize;
    }
    let exp = 63 - value.leading_zeros(); // >= FIRST_EXP
    let shift = exp - SUB_BITS;
    let sub = (value >> shift) - SUB; // 0..SUB
    EXACT as usize + (exp - FIRST_EXP) as usize * SUB as usize + sub as usize
}

/// Smallest and largest value that land in bucket `index`.
fn bucket_bounds(index: usize) -> (u64, u64) {
    if (index as u64) < EXACT {
        return (index as u64, index as u64);
    }
    let rel = index as u64 - EXACT;
    let exp = FIRST_EXP + (rel / SUB) as u32;
    let sub = rel % SUB;
    let shift = exp - SUB_BITS;
    let low = (SUB + sub) << shift;
    let width = 1u64 << shift;
    (low, low.saturating_add(width - 1))
}

impl Histogram {
    pub fn new() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            count: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    pub fn record_micros(&mut self, micros: u64) {
        self.counts[bucket_of(micros)] += 1;
        self.count += 1;
        self.sum += u128::from(micros);
        self.min = self.min.min(micros);
        self.max = self.max.max(micros);
    }

    pub fn record(&mut self, elapsed: Duration) {
        self.record_micros(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn max_micros(&self) -> u64 {
        self.max
    }

    #[cfg(test)]
    pub fn min_micros(&self) -> u64 {
        if self.count == 0 {
            0
        } else {
            self.min
        }
    }

    pub fn mean_micros(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// The value at quantile `q` (0..=1): the smallest recorded value such that at least
    /// `ceil(q * count)` values are <= it, reported as the middle of its bucket (exact below
    /// 128 µs) and clamped to the recorded min/max; the top rank is the exact maximum. 0 for an
    /// empty histogram.
    pub fn quantile_micros(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let q = if q.is_nan() { 0.0 } else { q.clamp(0.0, 1.0) };
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        if rank == self.count {
            return self.max;
        }
        let mut seen = 0u64;
        for (index, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let (low, high) = bucket_bounds(index);
                let mid = low + (high - low) / 2;
                return mid.clamp(self.min, self.max);
            }
        }
        self.max
    }

    pub fn quantile_ms(&self, q: f64) -> f64 {
        self.quantile_micros(q) as f64 / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_the_range_contiguously() {
        let mut expected_low = 0u64;
        for index in 0..BUCKETS {
            let (low, high) = bucket_bounds(index);
            assert_eq!(low, expected_low, "bucket {index}");
            assert!(high >= low);
            assert_eq!(bucket_of(low), index);
            assert_eq!(bucket_of(high), index);
            if high == u64::MAX {
                assert_eq!(index, BUCKETS - 1);
                return;
            }
            expected_low = high + 1;
        }
        panic!("buckets end before u64::MAX");
    }

    #[test]
    fn relative_error_is_bounded() {
        for value in [
            128u64,
            129,
            1_000,
            4_095,
            12_345,
            999_999,
            10_000_000,
            1 << 40,
        ] {
            let (low, high) = bucket_bounds(bucket_of(value));
            assert!(low <= value && value <= high);
            assert!(
                (high - low) as f64 / value as f64 <= 1.0 / 64.0,
                "value {value} in [{low}, {high}]"
            );
        }
    }

    #[test]
    fn empty_histogram_reports_zero() {
        let h = Histogram::new();
        assert_eq!(h.count(), 0);
        assert_eq!(h.quantile_micros(0.5), 0);
        assert_eq!(h.quantile_micros(0.99), 0);
        assert_eq!(h.mean_micros(), 0.0);
        assert_eq!(h.min_micros(), 0);
    }

    #[test]
    fn small_values_give_exact_percentiles() {
        let mut h = Histogram::new();
        for v in 1..=100 {
            h.record_micros(v);
        }
        assert_eq!(h.quantile_micros(0.0), 1);
        assert_eq!(h.quantile_micros(0.5), 50);
        assert_eq!(h.quantile_micros(0.9), 90);
        assert_eq!(h.quantile_micros(0.99), 99);
        assert_eq!(h.quantile_micros(0.999), 100);
        assert_eq!(h.quantile_micros(1.0), 100);
        assert_eq!(h.max_micros(), 100);
        assert!((h.mean_micros() - 50.5).abs() < 1e-9);
    }

    #[test]
    fn large_value_percentiles_are_within_two_percent() {
        let mut h = Histogram::new();
        // 1 ms .. 100 ms in 10 µs steps: 9_901 values.
        let values: Vec<u64> = (0..=9_900).map(|i| 1_000 + i * 10).collect();
        for &v in &values {
            h.record_micros(v);
        }
        for q in [0.5, 0.9, 0.99, 0.999] {
            let rank = ((q * values.len() as f64).ceil() as usize).max(1);
            let exact = values[rank - 1] as f64;
            let got = h.quantile_micros(q) as f64;
            assert!(
                (got - exact).abs() / exact < 0.02,
                "q {q}: got {got}, exact {exact}"
            );
        }
        assert_eq!(h.quantile_micros(1.0), 100_000);
    }

    #[test]
    fn a_single_outlier_shows_in_max_and_the_tail_only() {
        let mut h = Histogram::new();
        for _ in 0..999 {
            h.record_micros(2_000);
        }
        h.record_micros(5_000_000);
        assert!((h.quantile_ms(0.5) - 2.0).abs() < 0.04);
        assert!((h.quantile_ms(0.99) - 2.0).abs() < 0.04);
        assert_eq!(h.max_micros(), 5_000_000);
        assert!(h.quantile_micros(0.9995) > 4_900_000);
    }

    #[test]
    fn merge_equals_recording_everything_in_one() {
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        let mut all = Histogram::new();
        for v in 0..5_000u64 {
            let value = v * 37 % 20_000;
            if v % 3 == 0 {
                a.record_micros(value);
            } else {
                b.record_micros(value);
            }
            all.record_micros(value);
        }
        a.merge(&b);
        assert_eq!(a, all);
        let mut empty = Histogram::new();
        empty.merge(&all);
        assert_eq!(empty, all);
    }

    #[test]
    fn records_durations() {
        let mut h = Histogram::new();
        h.record(Duration::from_millis(3));
        assert_eq!(h.max_micros(), 3_000);
        h.record(Duration::MAX);
        assert_eq!(h.max_micros(), u64::MAX);
    }
}
