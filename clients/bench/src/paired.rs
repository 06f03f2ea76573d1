//! Paired comparisons for O1: two configurations measured in rounds run
//! back to back (on/off, then off/on, ...), each pair giving one figure (a
//! ratio or a difference). The figure reported is the median over the
//! pairs, with a percentile-bootstrap 95% interval of that median and the
//! pairs' minimum and maximum; a target counts as met (or missed) only when
//! the whole interval is on one side of it, and as noisy otherwise.

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde::Serialize;

use crate::report::Met;

/// Resamples of the bootstrap.
const RESAMPLES: usize = 4000;

/// The pairs' figures, summarized.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Paired {
    pub n: usize,
    pub median: f64,
    /// The bootstrap 95% interval of the median.
    pub low: f64,
    pub high: f64,
    pub min: f64,
    pub max: f64,
}

fn median_of(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

impl Paired {
    /// `values` (one per pair) summarized; `seed` makes the bootstrap
    /// repeatable. Non-finite values are left out.
    pub fn of(values: &[f64], seed: u64) -> Self {
        let v = sorted(values.iter().copied().filter(|x| x.is_finite()).collect());
        let n = v.len();
        if n == 0 {
            return Self {
                n,
                median: f64::NAN,
                low: f64::NAN,
                high: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
            };
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let mut medians: Vec<f64> = (0..RESAMPLES)
            .map(|_| {
                let sample: Vec<f64> = (0..n).map(|_| v[rng.random_range(0..n)]).collect();
                median_of(&sorted(sample))
            })
            .collect();
        medians.sort_by(f64::total_cmp);
        let at = |p: f64| medians[((RESAMPLES - 1) as f64 * p).round() as usize];
        Self {
            n,
            median: median_of(&v),
            low: at(0.025),
            high: at(0.975),
            min: v[0],
            max: v[n - 1],
        }
    }

    /// Each pair's `a / b` (`a` and `b` in the same pair order).
    pub fn ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
        a.iter()
            .zip(b)
            .map(|(x, y)| if *y > 0.0 { x / y } else { f64::NAN })
            .collect()
    }

    /// Each pair's `a - b`.
    pub fn differences(a: &[f64], b: &[f64]) -> Vec<f64> {
        a.iter().zip(b).map(|(x, y)| x - y).collect()
    }

    /// Whether the figure is at least `limit`: met when the interval's low
    /// end is, missed when its high end is below, noisy in between.
    pub fn at_least(&self, limit: f64) -> Met {
        if self.n == 0 {
            Met::NA
        } else if self.low >= limit {
            Met::Yes
        } else if self.high < limit {
            Met::No
        } else {
            Met::Noisy
        }
    }

    /// Whether the figure is at most `limit` (as [`Paired::at_least`]).
    pub fn at_most(&self, limit: f64) -> Met {
        if self.n == 0 {
            Met::NA
        } else if self.high <= limit {
            Met::Yes
        } else if self.low > limit {
            Met::No
        } else {
            Met::Noisy
        }
    }

    /// `[low, high] (pairs min .. max, n)` with `digits` decimals.
    pub fn spread(&self, digits: usize) -> String {
        format!(
            "95% CI [{:.d$}, {:.d$}]; pairs {:.d$} .. {:.d$} (n={})",
            self.low,
            self.high,
            self.min,
            self.max,
            self.n,
            d = digits
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_and_its_interval_bracket_the_pairs() {
        let values = [0.97, 0.99, 1.0, 1.01, 1.02, 0.98, 1.0, 0.995];
        let p = Paired::of(&values, 7);
        assert_eq!(p.n, 8);
        assert!((p.median - 0.9975).abs() < 1e-12, "{p:?}");
        assert!(p.min <= p.low && p.low <= p.median && p.median <= p.high && p.high <= p.max);
        assert_eq!((p.min, p.max), (0.97, 1.02));
        // The same seed gives the same interval.
        let q = Paired::of(&values, 7);
        assert_eq!((p.low, p.high), (q.low, q.high));
    }

    #[test]
    fn a_target_is_met_or_missed_only_clear_of_the_interval() {
        let tight = Paired::of(&[1.0, 1.001, 0.999, 1.0, 1.002, 0.998], 1);
        assert_eq!(tight.at_least(0.98), Met::Yes);
        assert_eq!(tight.at_least(1.05), Met::No);
        let wide = Paired::of(&[0.90, 1.10, 0.95, 1.05, 0.97, 1.02], 1);
        assert_eq!(wide.at_least(0.98), Met::Noisy);
        let deltas = Paired::of(&[3.0, 5.0, 4.0, 6.0, 2.0], 1);
        assert_eq!(deltas.at_most(20.0), Met::Yes);
        assert_eq!(deltas.at_most(1.0), Met::No);
        assert_eq!(Paired::of(&[], 1).at_most(20.0), Met::NA);
    }

    #[test]
    fn pairs_are_formed_in_order_and_bad_ones_left_out() {
        let r = Paired::ratios(&[10.0, 9.0, 5.0], &[10.0, 10.0, 0.0]);
        assert_eq!(r[..2], [1.0, 0.9]);
        assert!(r[2].is_nan());
        assert_eq!(Paired::of(&r, 1).n, 2);
        assert_eq!(Paired::differences(&[5.0, 7.0], &[4.0, 9.0]), [1.0, -2.0]);
    }
}
