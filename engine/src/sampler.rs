//! Picks the next token from one row of float32 logits: greedy, or
//! temperature / top-k / top-p sampling with the request's own seeded
//! generator (same seed, same tokens).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Sampling settings of one request, with defaults already resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// 0 means greedy.
    pub temperature: f32,
    /// In (0, 1]; 1 is off.
    pub top_p: f32,
    /// 0 is off.
    pub top_k: u32,
    /// None: seeded from the OS.
    pub seed: Option<u64>,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
        }
    }
}

/// A request's sampler: its settings and its own random generator.
pub struct Sampler {
    cfg: Sampling,
    rng: ChaCha8Rng,
}

impl Sampler {
    pub fn new(cfg: Sampling) -> Self {
        let rng = match cfg.seed {
            Some(s) => ChaCha8Rng::seed_from_u64(s),
            None => ChaCha8Rng::from_os_rng(),
        };
        Self { cfg, rng }
    }

    /// The next token id for these logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.cfg.temperature <= 0.0 || self.cfg.top_k == 1 {
            return argmax(logits);
        }
        let t = self.cfg.temperature;
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, l / t))
            .collect();
        if cand.is_empty() {
            return argmax(logits);
        }
        // Highest first; ties keep the lower id first.
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if self.cfg.top_k > 0 {
            cand.truncate(self.cfg.top_k as usize);
        }
        let max = cand[0].1;
        let mut probs: Vec<f32> = cand.iter().map(|(_, l)| (l - max).exp()).collect();
        let sum: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= sum);
        if self.cfg.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, p) in probs.iter().enumerate() {
                acc += p;
                if acc >= self.cfg.top_p {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            cand.truncate(keep);
            let s: f32 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= s);
        }
        let r: f32 = self.rng.random();
        let mut acc = 0.0;
        for (i, p) in probs.iter().enumerate() {
            acc += p;
            if r < acc {
                return cand[i].0;
            }
        }
        cand[cand.len() - 1].0
    }
}

/// Index of the largest value; the first one on ties (as torch.argmax).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(temperature: f32, top_p: f32, top_k: u32, seed: u64) -> Sampler {
        Sampler::new(Sampling {
            temperature,
            top_p,
            top_k,
            seed: Some(seed),
        })
    }

    #[test]
    fn greedy_takes_first_max() {
        assert_eq!(argmax(&[0.1, 3.0, 3.0, -1.0]), 1);
        assert_eq!(s(0.0, 1.0, 0, 1).sample(&[0.0, -1.0, 2.0]), 2);
    }

    #[test]
    fn same_seed_same_tokens_other_seed_differs() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let run = |seed| {
            let mut x = s(1.0, 1.0, 0, seed);
            (0..64).map(|_| x.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_and_top_p_restrict_support() {
        let logits = [5.0, 4.0, 0.0, -3.0, 4.5];
        let mut k2 = s(1.0, 1.0, 2, 3);
        for _ in 0..200 {
            assert!([0, 4].contains(&k2.sample(&logits)));
        }
        // p(0) ~ 0.50, p(4) ~ 0.30: top_p 0.6 keeps exactly those two.
        let mut p = s(1.0, 0.6, 0, 4);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..500 {
            seen.insert(p.sample(&logits));
        }
        assert_eq!(seen, [0u32, 4].into_iter().collect());
    }

    #[test]
    fn non_finite_logits_never_chosen() {
        let logits = [f32::NEG_INFINITY, 1.0, f32::NAN, 1.0];
        let mut x = s(1.0, 1.0, 0, 5);
        for _ in 0..100 {
            assert!([1, 3].contains(&x.sample(&logits)));
        }
    }
}
