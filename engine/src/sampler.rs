//! Picks the next token from one row of float32 logits, in vLLM's order:
//! logit bias, suppressed tokens (min_tokens), repetition / frequency /
//! presence penalties, then greedy, or temperature with top-k, top-p and
//! min-p, sampled with the request's own seeded generator (same seed, same
//! tokens).

use std::collections::{HashMap, HashSet};

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
    /// Drop tokens less likely than min_p times the most likely; 0 is off.
    pub min_p: f32,
    /// Subtracted once from every token already generated (OpenAI).
    pub presence_penalty: f32,
    /// Subtracted per occurrence of every token already generated (OpenAI).
    pub frequency_penalty: f32,
    /// Divides positive (multiplies negative) logits of tokens seen in the
    /// prompt or output (transformers / vLLM); 1 is off.
    pub repetition_penalty: f32,
    /// Added to the logits of these tokens.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
        }
    }
}

/// A request's sampler: its settings, what it has generated (for the
/// penalties) and its own random generator.
pub struct Sampler {
    cfg: Sampling,
    rng: ChaCha8Rng,
    prompt: HashSet<u32>,
    counts: HashMap<u32, u32>,
}

impl Sampler {
    pub fn new(cfg: Sampling) -> Self {
        let rng = match cfg.seed {
            Some(s) => ChaCha8Rng::seed_from_u64(s),
            None => ChaCha8Rng::from_os_rng(),
        };
        Self {
            cfg,
            rng,
            prompt: HashSet::new(),
            counts: HashMap::new(),
        }
    }

    /// Remembers the prompt's tokens (the repetition penalty covers them).
    pub fn with_prompt(mut self, prompt: &[u32]) -> Self {
        if self.cfg.repetition_penalty != 1.0 {
            self.prompt = prompt.iter().copied().collect();
        }
        self
    }

    /// The next token id for these logits, never one of `suppress`.
    pub fn sample(&mut self, logits: &[f32], suppress: &[u32]) -> u32 {
        let tok = self.pick(logits, suppress);
        *self.counts.entry(tok).or_default() += 1;
        tok
    }

    fn processed(&self, logits: &[f32], suppress: &[u32]) -> Option<Vec<f32>> {
        let c = &self.cfg;
        let penalize =
            c.repetition_penalty != 1.0 || c.presence_penalty != 0.0 || c.frequency_penalty != 0.0;
        if c.logit_bias.is_empty() && suppress.is_empty() && !penalize {
            return None;
        }
        let mut l = logits.to_vec();
        for &(t, b) in &c.logit_bias {
            if let Some(x) = l.get_mut(t as usize) {
                *x += b;
            }
        }
        for &t in suppress {
            if let Some(x) = l.get_mut(t as usize) {
                *x = f32::NEG_INFINITY;
            }
        }
        if c.repetition_penalty != 1.0 {
            // Once per token seen, in the prompt or the output or both (as
            // transformers' gather/scatter over the ids).
            for &t in self.repetition_tokens() {
                if let Some(x) = l.get_mut(t as usize) {
                    *x = if *x > 0.0 {
                        *x / c.repetition_penalty
                    } else {
                        *x * c.repetition_penalty
                    };
                }
            }
        }
        for (&t, &n) in &self.counts {
            if let Some(x) = l.get_mut(t as usize) {
                *x -= c.presence_penalty + c.frequency_penalty * n as f32;
            }
        }
        Some(l)
    }

    /// The tokens the repetition penalty applies to: each one seen in the
    /// prompt or generated, once.
    fn repetition_tokens(&self) -> impl Iterator<Item = &u32> {
        let prompt = &self.prompt;
        prompt
            .iter()
            .chain(self.counts.keys().filter(move |t| !prompt.contains(t)))
    }

    /// What the device sampler needs to pick this sampler's next token from
    /// row `row` of a step's logits (of `vocab` tokens), never one of
    /// `suppress`, under an additive constraint `mask` (0 or -inf per
    /// token); draws the one random number the host sampler would. Call
    /// [`Sampler::record`] with the token picked.
    pub(crate) fn device_plan(
        &mut self,
        row: i64,
        suppress: &[u32],
        mask: Option<Vec<f32>>,
        vocab: usize,
    ) -> crate::sampler_device::RowPick {
        let c = &self.cfg;
        let in_vocab = |t: u32| (t as usize) < vocab;
        let mut additive: Vec<(u32, f32)> = c
            .logit_bias
            .iter()
            .copied()
            .filter(|&(t, _)| in_vocab(t))
            .collect();
        additive.extend(
            suppress
                .iter()
                .filter(|&&t| in_vocab(t))
                .map(|&t| (t, f32::NEG_INFINITY)),
        );
        let repetition = (c.repetition_penalty != 1.0).then(|| {
            let ids = self
                .repetition_tokens()
                .copied()
                .filter(|&t| in_vocab(t))
                .collect();
            (c.repetition_penalty, ids)
        });
        let penalties = if c.presence_penalty != 0.0 || c.frequency_penalty != 0.0 {
            self.counts
                .iter()
                .filter(|&(&t, _)| in_vocab(t))
                .map(|(&t, &n)| (t, c.presence_penalty + c.frequency_penalty * n as f32))
                .collect()
        } else {
            Vec::new()
        };
        let greedy = c.temperature <= 0.0 || c.top_k == 1;
        let (temperature, top_k, top_p, min_p) = (c.temperature, c.top_k, c.top_p, c.min_p);
        let draw = (!greedy).then(|| self.rng.random::<f32>());
        crate::sampler_device::RowPick {
            row,
            mask,
            additive,
            repetition,
            penalties,
            temperature,
            top_k,
            top_p,
            min_p,
            draw,
        }
    }

    /// Counts a token the device sampler picked (for the penalties).
    pub(crate) fn record(&mut self, tok: u32) {
        *self.counts.entry(tok).or_default() += 1;
    }

    fn pick(&mut self, logits: &[f32], suppress: &[u32]) -> u32 {
        let owned = self.processed(logits, suppress);
        let logits = owned.as_deref().unwrap_or(logits);
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
        // Probabilities in f64 (exp of the f32 difference): sums over a
        // large vocabulary then agree with the device sampler's, whose
        // order of addition differs, far below any pick's margin.
        let mut probs: Vec<f64> = cand.iter().map(|(_, l)| f64::from(l - max).exp()).collect();
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= sum);
        if self.cfg.min_p > 0.0 {
            // Sorted: keep the prefix at least min_p times as likely as the first.
            let floor = f64::from(self.cfg.min_p) * probs[0];
            let keep = probs.iter().take_while(|&&p| p >= floor).count().max(1);
            probs.truncate(keep);
            cand.truncate(keep);
            let s: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= s);
        }
        if self.cfg.top_p < 1.0 {
            let top_p = f64::from(self.cfg.top_p);
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, p) in probs.iter().enumerate() {
                acc += p;
                if acc >= top_p {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            cand.truncate(keep);
            let s: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= s);
        }
        let r = f64::from(self.rng.random::<f32>());
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

/// Log-probability of `token` and the `k` most likely tokens under the
/// softmax of `logits` (computed in f64 for a stable log-sum-exp).
pub fn logprobs(logits: &[f32], token: u32, k: usize) -> crate::TokenLogprobs {
    let max = logits
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
    let log_z = max + sum.ln();
    let lp = |x: f32| (x as f64 - log_z) as f32;
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let k = k.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| {
            logits[b as usize].total_cmp(&logits[a as usize])
        });
        idx.truncate(k);
        idx.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        top = idx
            .into_iter()
            .map(|i| (i, lp(logits[i as usize])))
            .collect();
    }
    crate::TokenLogprobs {
        token,
        logprob: lp(logits
            .get(token as usize)
            .copied()
            .unwrap_or(f32::NEG_INFINITY)),
        top,
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
            ..Sampling::default()
        })
    }

    #[test]
    fn greedy_takes_first_max() {
        assert_eq!(argmax(&[0.1, 3.0, 3.0, -1.0]), 1);
        assert_eq!(s(0.0, 1.0, 0, 1).sample(&[0.0, -1.0, 2.0], &[]), 2);
    }

    #[test]
    fn same_seed_same_tokens_other_seed_differs() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let run = |seed| {
            let mut x = s(1.0, 1.0, 0, seed);
            (0..64).map(|_| x.sample(&logits, &[])).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_and_top_p_restrict_support() {
        let logits = [5.0, 4.0, 0.0, -3.0, 4.5];
        let mut k2 = s(1.0, 1.0, 2, 3);
        for _ in 0..200 {
            assert!([0, 4].contains(&k2.sample(&logits, &[])));
        }
        // p(0) ~ 0.50, p(4) ~ 0.30: top_p 0.6 keeps exactly those two.
        let mut p = s(1.0, 0.6, 0, 4);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..500 {
            seen.insert(p.sample(&logits, &[]));
        }
        assert_eq!(seen, [0u32, 4].into_iter().collect());
    }

    #[test]
    fn non_finite_logits_never_chosen() {
        let logits = [f32::NEG_INFINITY, 1.0, f32::NAN, 1.0];
        let mut x = s(1.0, 1.0, 0, 5);
        for _ in 0..100 {
            assert!([1, 3].contains(&x.sample(&logits, &[])));
        }
    }

    fn greedy_with(cfg: Sampling) -> Sampler {
        Sampler::new(Sampling {
            temperature: 0.0,
            seed: Some(1),
            ..cfg
        })
    }

    #[test]
    fn logit_bias_and_suppression_move_the_choice() {
        let logits = [1.0, 3.0, 2.0];
        let mut ban = greedy_with(Sampling {
            logit_bias: vec![(1, -100.0)],
            ..Sampling::default()
        });
        assert_eq!(ban.sample(&logits, &[]), 2);
        let mut force = greedy_with(Sampling {
            logit_bias: vec![(0, 100.0), (99, 5.0)],
            ..Sampling::default()
        });
        assert_eq!(
            force.sample(&logits, &[]),
            0,
            "out-of-range ids are ignored"
        );
        assert_eq!(greedy_with(Sampling::default()).sample(&logits, &[1, 2]), 0);
    }

    #[test]
    fn penalties_follow_openai_and_transformers() {
        // Frequency: each repeat costs more; token 0 wins once token 1 has
        // been generated twice (3 - 0.3 = 2.7 > 2.5, but 3 - 2 * 0.3 = 2.4 < 2.5).
        let logits = [2.5, 3.0];
        let mut f = greedy_with(Sampling {
            frequency_penalty: 0.3,
            ..Sampling::default()
        });
        let picks: Vec<u32> = (0..3).map(|_| f.sample(&logits, &[])).collect();
        assert_eq!(picks, vec![1, 1, 0]);
        // Presence: a flat cost once seen.
        let mut p = greedy_with(Sampling {
            presence_penalty: 1.0,
            ..Sampling::default()
        });
        assert_eq!((p.sample(&logits, &[]), p.sample(&logits, &[])), (1, 0));
        // Repetition: positive logits of prompt tokens are divided, negative multiplied.
        let mut r = greedy_with(Sampling {
            repetition_penalty: 2.0,
            ..Sampling::default()
        })
        .with_prompt(&[1, 2]);
        assert_eq!(r.sample(&[2.0, 3.0, -0.1], &[]), 0, "3/2 = 1.5 < 2");
        let mut neg = greedy_with(Sampling {
            repetition_penalty: 2.0,
            ..Sampling::default()
        })
        .with_prompt(&[0]);
        assert_eq!(neg.sample(&[-1.0, -1.5], &[]), 1, "-1 * 2 = -2 < -1.5");
    }

    #[test]
    fn logprobs_are_a_normalised_log_softmax() {
        let logits = [1.0f32, 3.0, 2.0, -1.0];
        let l = logprobs(&logits, 2, 2);
        let z: f64 = logits.iter().map(|&x| (x as f64).exp()).sum();
        assert!((l.logprob as f64 - (2.0 - z.ln())).abs() < 1e-6);
        assert_eq!(l.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
        let total: f64 = (0..4)
            .map(|t| (logprobs(&logits, t, 0).logprob as f64).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6);
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        // p ~ [0.66, 0.24, 0.09, 0.01]: min_p 0.2 keeps the first two only.
        let logits = [3.0, 2.0, 1.0, -1.0];
        let mut m = Sampler::new(Sampling {
            min_p: 0.2,
            seed: Some(9),
            ..Sampling::default()
        });
        let seen: std::collections::HashSet<u32> =
            (0..500).map(|_| m.sample(&logits, &[])).collect();
        assert_eq!(seen, [0u32, 1].into_iter().collect());
    }
}
