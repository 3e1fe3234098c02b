//! Which SKU each iteration targets: uniform, Zipf(s) by rank, or one hot SKU.
//!
//! SKU index `k` (0-based) is Zipf rank `k + 1`, so index 0 is always the hottest SKU under every
//! skew. The Zipf sampler is an inverse-CDF table over the N SKUs: exact, O(N) memory (8 bytes a
//! SKU), O(log N) per draw, and deterministic for a seeded RNG.

use std::fmt;
use std::str::FromStr;

use rand::Rng;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Skew {
    /// Every SKU equally likely.
    Uniform,
    /// P(rank k) proportional to 1 / k^exponent.
    Zipf { exponent: f64 },
    /// `fraction` of the draws go to SKU 0; the rest spread uniformly over the others.
    Hot { fraction: f64 },
}

impl FromStr for Skew {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let (kind, arg) = match text.split_once(':') {
            Some((kind, arg)) => (kind.trim(), Some(arg.trim())),
            None => (text, None),
        };
        let number = |default: Option<f64>| -> Result<f64, String> {
            match arg {
                Some(a) => a
                    .parse::<f64>()
                    .map_err(|_| format!("invalid number {a:?} in skew {text:?}")),
                None => {
                    default.ok_or_else(|| format!("skew {text:?} needs a value, e.g. {kind}:0.9"))
                }
            }
        };
        match kind.to_ascii_lowercase().as_str() {
            "uniform" if arg.is_none() => Ok(Skew::Uniform),
            "zipf" => {
                let exponent = number(Some(1.0))?;
                if !(0.0..=10.0).contains(&exponent) {
                    return Err(format!("zipf exponent must be in 0..=10, got {exponent}"));
                }
                Ok(Skew::Zipf { exponent })
            }
            "hot" => {
                let fraction = number(None)?;
                if !(fraction.is_finite() && (0.0..=1.0).contains(&fraction)) {
                    return Err(format!("hot fraction must be in 0..=1, got {fraction}"));
                }
                Ok(Skew::Hot { fraction })
            }
            _ => Err(format!(
                "unknown skew {text:?}; use uniform, zipf:S (e.g. zipf:1.1) or hot:F (e.g. hot:0.9)"
            )),
        }
    }
}

impl fmt::Display for Skew {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Skew::Uniform => write!(f, "uniform"),
            Skew::Zipf { exponent } => write!(f, "zipf:{exponent}"),
            Skew::Hot { fraction } => write!(f, "hot:{fraction}"),
        }
    }
}

/// Zipf distribution over ranks 1..=n, sampled by inverting its cumulative distribution.
#[derive(Debug, Clone)]
pub struct Zipf {
    /// cdf[k] = P(index <= k); the last entry is exactly 1.
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize, exponent: f64) -> Result<Self, String> {
        if n == 0 {
            return Err("zipf needs at least one item".into());
        }
        if !(exponent.is_finite() && exponent >= 0.0) {
            return Err(format!(
                "zipf exponent must be finite and >= 0, got {exponent}"
            ));
        }
        let mut cdf = Vec::with_capacity(n);
        let mut total = 0.0f64;
        for rank in 1..=n {
            total += (rank as f64).powf(-exponent);
            cdf.push(total);
        }
        for c in &mut cdf {
            *c /= total;
        }
        *cdf.last_mut().expect("n >= 1") = 1.0;
        Ok(Zipf { cdf })
    }

    /// Probability of index `k` (rank `k + 1`).
    #[cfg(test)]
    pub fn probability(&self, k: usize) -> f64 {
        match k {
            0 => self.cdf[0],
            k if k < self.cdf.len() => self.cdf[k] - self.cdf[k - 1],
            _ => 0.0,
        }
    }

    /// Index of the first entry whose cumulative probability exceeds `u` (in `[0, 1)`).
    pub fn index_for(&self, u: f64) -> usize {
        self.cdf
            .partition_point(|&c| c <= u)
            .min(self.cdf.len() - 1)
    }

    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> usize {
        self.index_for(rng.random::<f64>())
    }
}

/// Draws SKU indexes in `0..n` according to a [`Skew`]. Immutable; share it between workers and
/// give each worker its own RNG.
#[derive(Debug, Clone)]
pub enum SkuPicker {
    Uniform { n: usize },
    Zipf(Zipf),
    Hot { n: usize, fraction: f64 },
}

impl SkuPicker {
    pub fn new(skew: Skew, n: usize) -> Result<Self, String> {
        if n == 0 {
            return Err("need at least one SKU".into());
        }
        Ok(match skew {
            Skew::Uniform => SkuPicker::Uniform { n },
            Skew::Zipf { exponent } => SkuPicker::Zipf(Zipf::new(n, exponent)?),
            Skew::Hot { fraction } => SkuPicker::Hot { n, fraction },
        })
    }

    pub fn pick<R: Rng + ?Sized>(&self, rng: &mut R) -> usize {
        match self {
            SkuPicker::Uniform { n } => rng.random_range(0..*n),
            SkuPicker::Zipf(zipf) => zipf.sample(rng),
            SkuPicker::Hot { n, fraction } => {
                if *n == 1 || rng.random::<f64>() < *fraction {
                    0
                } else {
                    rng.random_range(1..*n)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn frequencies(picker: &SkuPicker, n: usize, draws: usize, seed: u64) -> Vec<f64> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut counts = vec![0u64; n];
        for _ in 0..draws {
            counts[picker.pick(&mut rng)] += 1;
        }
        counts.iter().map(|&c| c as f64 / draws as f64).collect()
    }

    #[test]
    fn parses_skews() {
        assert_eq!("uniform".parse::<Skew>(), Ok(Skew::Uniform));
        assert_eq!("zipf:1.1".parse::<Skew>(), Ok(Skew::Zipf { exponent: 1.1 }));
        assert_eq!("zipf".parse::<Skew>(), Ok(Skew::Zipf { exponent: 1.0 }));
        assert_eq!(
            "ZIPF: 0.8".parse::<Skew>(),
            Ok(Skew::Zipf { exponent: 0.8 })
        );
        assert_eq!("hot:0.9".parse::<Skew>(), Ok(Skew::Hot { fraction: 0.9 }));
        assert_eq!("hot:1".parse::<Skew>(), Ok(Skew::Hot { fraction: 1.0 }));
        for bad in [
            "",
            "foo",
            "hot",
            "hot:1.5",
            "hot:-0.1",
            "hot:x",
            "zipf:-1",
            "zipf:nan",
            "zipf:inf",
            "uniform:3",
        ] {
            assert!(bad.parse::<Skew>().is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn display_round_trips() {
        for text in ["uniform", "zipf:1.1", "hot:0.9"] {
            let skew: Skew = text.parse().unwrap();
            assert_eq!(skew.to_string(), text);
            assert_eq!(skew.to_string().parse::<Skew>().unwrap(), skew);
        }
    }

    #[test]
    fn zipf_probabilities_follow_the_law_and_sum_to_one() {
        let zipf = Zipf::new(1000, 1.1).unwrap();
        let total: f64 = (0..1000).map(|k| zipf.probability(k)).sum();
        assert!((total - 1.0).abs() < 1e-9);
        for k in 1..20 {
            let ratio = zipf.probability(0) / zipf.probability(k);
            let expected = ((k + 1) as f64).powf(1.1);
            assert!((ratio - expected).abs() / expected < 1e-9);
        }
        assert_eq!(zipf.probability(1000), 0.0);
    }

    #[test]
    fn zipf_inverse_cdf_edges() {
        let zipf = Zipf::new(3, 1.0).unwrap();
        assert_eq!(zipf.index_for(0.0), 0);
        assert_eq!(zipf.index_for(0.999_999_999), 2);
        assert_eq!(zipf.index_for(1.0), 2);
        let single = Zipf::new(1, 1.1).unwrap();
        assert_eq!(single.index_for(0.5), 0);
        assert!(Zipf::new(0, 1.0).is_err());
        // Exponent 0 is the uniform distribution.
        let flat = Zipf::new(4, 0.0).unwrap();
        for k in 0..4 {
            assert!((flat.probability(k) - 0.25).abs() < 1e-12);
        }
    }

    #[test]
    fn zipf_sample_frequencies_follow_the_law_roughly() {
        let n = 100;
        let exponent = 1.1;
        let draws = 400_000;
        let picker = SkuPicker::new(Skew::Zipf { exponent }, n).unwrap();
        let SkuPicker::Zipf(zipf) = &picker else {
            unreachable!()
        };
        let freq = frequencies(&picker, n, draws, 42);
        // Every head rank within 5 % of its probability.
        for (k, f) in freq.iter().enumerate().take(10) {
            let p = zipf.probability(k);
            assert!(
                (f - p).abs() / p < 0.05,
                "rank {}: frequency {f} vs probability {p}",
                k + 1
            );
        }
        // f(1)/f(2) ~ 2^s.
        let ratio = freq[0] / freq[1];
        assert!((ratio - 2f64.powf(exponent)).abs() < 0.15, "ratio {ratio}");
        // The log-log slope over the first 20 ranks is about -s.
        let points: Vec<(f64, f64)> = (0..20)
            .map(|k| (((k + 1) as f64).ln(), freq[k].ln()))
            .collect();
        let mean_x = points.iter().map(|p| p.0).sum::<f64>() / points.len() as f64;
        let mean_y = points.iter().map(|p| p.1).sum::<f64>() / points.len() as f64;
        let slope = points
            .iter()
            .map(|p| (p.0 - mean_x) * (p.1 - mean_y))
            .sum::<f64>()
            / points.iter().map(|p| (p.0 - mean_x).powi(2)).sum::<f64>();
        assert!((slope + exponent).abs() < 0.1, "slope {slope}");
        // Chi-square goodness of fit over all 100 ranks (99 degrees of freedom; the 0.1 %
        // critical value is ~149).
        let chi2: f64 = (0..n)
            .map(|k| {
                let expected = zipf.probability(k) * draws as f64;
                let observed = freq[k] * draws as f64;
                (observed - expected).powi(2) / expected
            })
            .sum();
        assert!(chi2 < 149.0, "chi-square {chi2}");
    }

    #[test]
    fn hot_sends_the_fraction_to_sku_zero_and_spreads_the_rest() {
        let n = 10;
        let picker = SkuPicker::new(Skew::Hot { fraction: 0.9 }, n).unwrap();
        let freq = frequencies(&picker, n, 200_000, 7);
        assert!((freq[0] - 0.9).abs() < 0.005, "hot share {}", freq[0]);
        for f in &freq[1..] {
            assert!((f - 0.1 / 9.0).abs() < 0.003, "cold share {f}");
        }
        let single = SkuPicker::new(Skew::Hot { fraction: 0.5 }, 1).unwrap();
        assert_eq!(frequencies(&single, 1, 1000, 1), vec![1.0]);
    }

    #[test]
    fn uniform_is_flat() {
        let n = 20;
        let picker = SkuPicker::new(Skew::Uniform, n).unwrap();
        let freq = frequencies(&picker, n, 200_000, 3);
        for f in freq {
            assert!((f - 0.05).abs() < 0.004);
        }
        assert!(SkuPicker::new(Skew::Uniform, 0).is_err());
    }

    #[test]
    fn seeded_draws_are_reproducible() {
        let picker = SkuPicker::new(Skew::Zipf { exponent: 1.1 }, 1000).unwrap();
        let draw = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..100).map(|_| picker.pick(&mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(draw(42), draw(42));
        assert_ne!(draw(42), draw(43));
    }
}
