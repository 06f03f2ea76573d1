//! Picks the next token from one row of float32 logits, in vLLM's order:
//! logit bias, suppressed tokens (min_tokens), repetition / frequency /
//! presence penalties, then greedy, or temperature with top-k, top-p and
//! min-p, sampled with the request's own seeded generator (same seed, same
//! tokens).

use std::collections::{HashMap, HashSet};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod argmax;
pub use argmax::argmax;

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
    /// The generator a draft model's proposals are drawn with: the
    /// request's seed, on another ChaCha stream.
    draft_rng: ChaCha8Rng,
}

impl Sampler {
    pub fn new(cfg: Sampling) -> Self {
        let rng = match cfg.seed {
            Some(s) => ChaCha8Rng::seed_from_u64(s),
            None => ChaCha8Rng::from_os_rng(),
        };
        let mut draft_rng = rng.clone();
        draft_rng.set_stream(1);
        Self {
            cfg,
            rng,
            prompt: HashSet::new(),
            counts: HashMap::new(),
            draft_rng,
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
        let d = self.distribution(logits, suppress);
        if d.drawn {
            d.draw(&mut self.rng)
        } else {
            d.tokens[0]
        }
    }

    /// The request's logit bias.
    pub(crate) fn logit_bias(&self) -> &[(u32, f32)] {
        &self.cfg.logit_bias
    }

    /// True when this sampler takes the most likely token (no draw).
    pub(crate) fn is_greedy(&self) -> bool {
        self.cfg.temperature <= 0.0 || self.cfg.top_k == 1
    }

    /// The distribution the next token is drawn from, for these logits,
    /// never one of `suppress`: logit bias, suppression and penalties, then
    /// temperature, top-k, min-p and top-p (greedy: the first maximum, as
    /// a point).
    pub(crate) fn distribution(&self, logits: &[f32], suppress: &[u32]) -> Dist {
        let owned = self.processed(logits, suppress);
        let logits = owned.as_deref().unwrap_or(logits);
        let point = |t: u32| Dist {
            tokens: vec![t],
            probs: vec![1.0],
            drawn: false,
        };
        if self.is_greedy() {
            return point(argmax(logits));
        }
        let t = self.cfg.temperature;
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, l / t))
            .collect();
        if cand.is_empty() {
            return point(argmax(logits));
        }
        // Highest first; ties keep the lower id first (a total order, so
        // selecting the top k before sorting them gives the same list).
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let k = self.cfg.top_k as usize;
        if k > 0 && k < cand.len() {
            cand.select_nth_unstable_by(k - 1, order);
            cand.truncate(k);
        }
        cand.sort_by(order);
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
        Dist {
            tokens: cand.into_iter().map(|(t, _)| t).collect(),
            probs,
            drawn: true,
        }
    }

    /// The draft model's proposal for this request from the draft's
    /// `logits`: a token drawn from the distribution this sampler's rules
    /// give those logits (with its own generator, apart from the one the
    /// request's tokens are drawn with), and that distribution (`q`, for
    /// [`Sampler::sample_speculative`]).
    /// `before`: the tokens proposed ahead of this one in the same step,
    /// counted for the penalties as the model's sampler will count them.
    pub(crate) fn draft_draw(
        &mut self,
        logits: &[f32],
        suppress: &[u32],
        before: &[u32],
    ) -> (u32, Dist) {
        let penalize = self.cfg.repetition_penalty != 1.0
            || self.cfg.presence_penalty != 0.0
            || self.cfg.frequency_penalty != 0.0;
        let before = if penalize { before } else { &[] };
        for &t in before {
            *self.counts.entry(t).or_default() += 1;
        }
        let q = self.distribution(logits, suppress);
        for &t in before {
            if let Some(n) = self.counts.get_mut(&t) {
                *n -= 1;
                if *n == 0 {
                    self.counts.remove(&t);
                }
            }
        }
        let x = q.draw(&mut self.draft_rng);
        (x, q)
    }

    /// Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) of
    /// the next token, for these (the model's) logits, given a proposal
    /// `x` drawn from `q`: `x` is kept with probability min(1, p(x)/q(x)),
    /// where p is [`Sampler::distribution`] of the logits; otherwise the
    /// token is drawn from max(0, p - q), renormalized. The token that
    /// comes out is distributed as p, whatever q is. A greedy sampler
    /// takes p's point (kept when it is `x`). Returns the token and
    /// whether it is the proposal.
    pub(crate) fn sample_speculative(
        &mut self,
        logits: &[f32],
        suppress: &[u32],
        x: u32,
        q: &Dist,
    ) -> (u32, bool) {
        let p = self.distribution(logits, suppress);
        let tok = if p.drawn {
            let u = f64::from(self.rng.random::<f32>());
            let v = f64::from(self.rng.random::<f32>());
            speculative_pick(&p, q, x, u, v, logits.len())
        } else {
            p.tokens[0]
        };
        *self.counts.entry(tok).or_default() += 1;
        (tok, tok == x)
    }
}

/// A distribution over tokens: the tokens it can give, most likely first,
/// with their probabilities (summing to 1).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Dist {
    pub tokens: Vec<u32>,
    pub probs: Vec<f64>,
    /// Drawn with a random number (false: a greedy point, taken as is).
    pub drawn: bool,
}

impl Dist {
    /// The probability of `tok`.
    pub fn prob(&self, tok: u32) -> f64 {
        self.tokens
            .iter()
            .position(|&t| t == tok)
            .map_or(0.0, |i| self.probs[i])
    }

    /// A token drawn with one uniform number from `rng` (a greedy point
    /// draws none).
    pub fn draw(&self, rng: &mut ChaCha8Rng) -> u32 {
        if !self.drawn {
            return self.tokens[0];
        }
        self.pick_at(f64::from(rng.random::<f32>()))
    }

    /// The token where the running sum of the probabilities first exceeds
    /// `r` (in [0, 1)); the last one when rounding leaves it short.
    fn pick_at(&self, r: f64) -> u32 {
        let mut acc = 0.0;
        for (i, p) in self.probs.iter().enumerate() {
            acc += p;
            if r < acc {
                return self.tokens[i];
            }
        }
        self.tokens[self.tokens.len() - 1]
    }
}

/// The speculative-sampling rule with its two uniform numbers `u` (the
/// acceptance test) and `v` (the draw from the residual), for a proposal
/// `x` drawn from `q`: `x` when u < p(x) / q(x), else a draw from
/// max(0, p - q) normalized (from p itself in the measure-zero case where
/// that is empty), over a vocabulary of `vocab` tokens.
pub(crate) fn speculative_pick(p: &Dist, q: &Dist, x: u32, u: f64, v: f64, vocab: usize) -> u32 {
    let (px, qx) = (p.prob(x), q.prob(x));
    if qx > 0.0 && u * qx < px {
        return x;
    }
    // q by token: a scan when its support is small, else a dense table.
    let dense_q = (q.tokens.len() > 64).then(|| {
        let mut d = vec![0f64; vocab.max(1)];
        for (&t, &pr) in q.tokens.iter().zip(&q.probs) {
            if let Some(x) = d.get_mut(t as usize) {
                *x = pr;
            }
        }
        d
    });
    let q_of = |t: u32| match &dense_q {
        Some(d) => d.get(t as usize).copied().unwrap_or(0.0),
        None => q.prob(t),
    };
    let mut residual: Vec<f64> = p
        .tokens
        .iter()
        .zip(&p.probs)
        .map(|(&t, &pr)| (pr - q_of(t)).max(0.0))
        .collect();
    let sum: f64 = residual.iter().sum();
    if sum <= 0.0 {
        return p.pick_at(v);
    }
    residual.iter_mut().for_each(|r| *r /= sum);
    Dist {
        tokens: p.tokens.clone(),
        probs: residual,
        drawn: true,
    }
    .pick_at(v)
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

    /// Pearson's statistic of `counts` (of `n` draws) against `p`
    /// (infinite when a token p cannot give was drawn).
    fn pearson(counts: &[u64], p: &[f64], n: u64) -> f64 {
        counts
            .iter()
            .zip(p)
            .map(|(&c, &pr)| {
                let e = pr * n as f64;
                if e == 0.0 {
                    if c == 0 { 0.0 } else { f64::INFINITY }
                } else {
                    (c as f64 - e).powi(2) / e
                }
            })
            .sum()
    }

    #[test]
    fn speculative_sampling_gives_the_target_distribution() {
        // p and q over six tokens, each with mass where the other has none.
        let p = Dist {
            tokens: vec![0, 1, 2, 3, 4],
            probs: vec![0.4, 0.3, 0.15, 0.1, 0.05],
            drawn: true,
        };
        let q = Dist {
            tokens: vec![2, 1, 5, 0],
            probs: vec![0.5, 0.3, 0.15, 0.05],
            drawn: true,
        };
        let dense_p = [0.4, 0.3, 0.15, 0.1, 0.05, 0.0];
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let n = 200_000u64;
        let (mut out, mut proposed, mut kept) = ([0u64; 6], [0u64; 6], 0u64);
        for _ in 0..n {
            let x = q.draw(&mut rng);
            proposed[x as usize] += 1;
            let (u, v) = (rng.random::<f64>(), rng.random::<f64>());
            let t = speculative_pick(&p, &q, x, u, v, 6);
            kept += u64::from(t == x);
            out[t as usize] += 1;
        }
        // Four degrees of freedom (p has five tokens): 18.47 is the
        // quantile at 1 - 1e-3.
        let stat = pearson(&out, &dense_p, n);
        assert!(stat < 18.47, "chi2 {stat:.2}: {out:?}");
        // The same statistic tells the proposals (q) apart from p: the
        // check has the power to see a rule that keeps proposals blindly.
        let dense_q = [0.05, 0.3, 0.5, 0.0, 0.0, 0.15];
        assert!(pearson(&proposed, &dense_p, n) > 1e4);
        assert!(pearson(&proposed, &dense_q, n) < 18.47 + 2.0);
        // Kept with probability sum(min(p, q)) = 0.05 + 0.3 + 0.15.
        let rate = kept as f64 / n as f64;
        assert!((rate - 0.5).abs() < 0.01, "kept {rate}");
    }

    #[test]
    fn speculative_sampling_of_a_greedy_request_compares() {
        let q = Dist {
            tokens: vec![1, 0],
            probs: vec![0.9, 0.1],
            drawn: true,
        };
        let mut g = greedy_with(Sampling::default());
        assert_eq!(
            g.sample_speculative(&[0.0, 2.0, 1.0], &[], 1, &q),
            (1, true)
        );
        assert_eq!(
            g.sample_speculative(&[0.0, 2.0, 1.0], &[], 0, &q),
            (1, false)
        );
        // Suppressed tokens are never the target's choice.
        assert_eq!(
            g.sample_speculative(&[0.0, 2.0, 1.0], &[1], 1, &q),
            (2, false)
        );
    }

    #[test]
    fn pick_draws_from_the_distribution_it_reports() {
        let logits: Vec<f32> = (0..40).map(|i| ((i * 7) % 11) as f32 * 0.4).collect();
        for (top_k, top_p, min_p) in [(0, 1.0, 0.0), (5, 1.0, 0.0), (0, 0.7, 0.0), (0, 1.0, 0.3)] {
            let cfg = Sampling {
                top_k,
                top_p,
                min_p,
                seed: Some(5),
                ..Sampling::default()
            };
            let (mut a, b) = (Sampler::new(cfg.clone()), Sampler::new(cfg));
            let d = b.distribution(&logits, &[]);
            assert!((d.probs.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            let mut rng = ChaCha8Rng::seed_from_u64(5);
            for _ in 0..50 {
                assert_eq!(a.sample(&logits, &[]), d.draw(&mut rng));
            }
        }
    }
}
