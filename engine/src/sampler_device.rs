//! Sampling on the device: the host sampler's rules (`crate::sampler`)
//! applied with tensor operations to a step's logits where they already
//! are, so that a decode step brings back one token id per sequence instead
//! of a row of the whole vocabulary, and the step's one host sync is that
//! copy.
//!
//! Each row is processed in the host sampler's order: constraint mask, logit
//! bias and suppressed tokens, the repetition penalty (once per token seen),
//! presence and frequency penalties; then greedy (the first maximum), or
//! temperature, top-k, min-p and top-p over the logits sorted highest first
//! (ties keep the lower id first, a stable sort), renormalising after each
//! filter as the host does (probabilities in f64 on both), and the token whose cumulative probability first
//! exceeds the row's random number. That number is drawn on the host from
//! the request's own seeded generator ([`crate::sampler::Sampler::device_plan`]),
//! one per sampled token as the host sampler draws, so a seed gives the same
//! tokens on either path; the sums run in a different order, so a pick can
//! differ only where the number falls within rounding of a boundary.

use tch::{Device, Kind, Tensor};

use crate::EngineError;

/// One row to pick from, with everything the host would apply to it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RowPick {
    /// The row of the step's logits.
    pub row: i64,
    /// A constraint's mask: 0 where allowed, -inf elsewhere (vocabulary long).
    pub mask: Option<Vec<f32>>,
    /// Added to these tokens: logit bias, and -inf for suppressed tokens.
    pub additive: Vec<(u32, f32)>,
    /// The repetition penalty and the tokens it applies to.
    pub repetition: Option<(f32, Vec<u32>)>,
    /// Subtracted from these tokens (presence + frequency penalties).
    pub penalties: Vec<(u32, f32)>,
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
    /// The uniform number in [0, 1) to sample with; None: greedy.
    pub draw: Option<f32>,
}

/// `GYRE_DEVICE_SAMPLING`: `0` never samples on the device, `1` always
/// does (on the CPU's tensors too: how tests exercise this path without a
/// GPU); unset, the engine samples on the device when it is CUDA.
pub(crate) fn from_env() -> Option<bool> {
    match std::env::var("GYRE_DEVICE_SAMPLING").as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    }
}

/// A step's picks, their host-side data packed and copied to the device
/// in two transfers (made before the step's forward pass, while the device
/// is idle, so that the only sync after it is the tokens coming back).
pub(crate) struct Prepared {
    n: usize,
    vocab: i64,
    ints: Tensor,
    floats: Tensor,
    /// Lengths of the sections of `ints`: rows, masked rows, additive,
    /// repetition and penalty positions, greedy rows, sampled rows.
    int_len: [i64; 7],
}

impl Prepared {
    /// Packs `picks` over a vocabulary of `vocab` for device `dev`; None
    /// when there is nothing to pick.
    pub(crate) fn new(
        picks: &[RowPick],
        vocab: i64,
        dev: Device,
    ) -> Result<Option<Self>, EngineError> {
        if picks.is_empty() {
            return Ok(None);
        }
        let mut ints: Vec<i64> = picks.iter().map(|p| p.row).collect();
        let mut floats: Vec<f32> = Vec::new();
        let masked: Vec<i64> = (0..picks.len() as i64)
            .filter(|&i| picks[i as usize].mask.is_some())
            .collect();
        ints.extend(&masked);
        // Sparse per-token terms at flat positions row * vocab + token.
        let mut sparse = |f: &dyn Fn(&RowPick) -> Vec<(u32, f32)>| {
            let mut n = 0;
            let mut vals = Vec::new();
            for (i, p) in picks.iter().enumerate() {
                for (t, v) in f(p) {
                    ints.push(i as i64 * vocab + i64::from(t));
                    vals.push(v);
                    n += 1;
                }
            }
            floats.extend(vals);
            n
        };
        let n_add = sparse(&|p| p.additive.clone());
        let n_rep = sparse(&|p| match &p.repetition {
            Some((r, toks)) => toks.iter().map(|&t| (t, *r)).collect(),
            None => Vec::new(),
        });
        let n_pen = sparse(&|p| p.penalties.iter().map(|&(t, v)| (t, -v)).collect());
        let greedy: Vec<i64> = (0..picks.len() as i64)
            .filter(|&i| picks[i as usize].draw.is_none())
            .collect();
        let sampled: Vec<i64> = (0..picks.len() as i64)
            .filter(|&i| picks[i as usize].draw.is_some())
            .collect();
        ints.extend(&greedy);
        ints.extend(&sampled);
        let col = |f: fn(&RowPick, i64) -> f32| -> Vec<f32> {
            sampled
                .iter()
                .map(|&i| f(&picks[i as usize], vocab))
                .collect()
        };
        floats.extend(col(|p, _| p.temperature));
        floats.extend(col(|p, v| {
            if p.top_k == 0 {
                v as f32
            } else {
                p.top_k as f32
            }
        }));
        floats.extend(col(|p, _| p.min_p));
        floats.extend(col(|p, _| p.top_p));
        floats.extend(col(|p, _| p.draw.unwrap_or(0.0)));
        for &i in &masked {
            if let Some(m) = &picks[i as usize].mask {
                if m.len() as i64 != vocab {
                    return Err(EngineError::Step(format!(
                        "a constraint mask of {} tokens for logits of {vocab}",
                        m.len()
                    )));
                }
                floats.extend(m);
            }
        }
        let up = |t: Tensor| -> Result<Tensor, EngineError> { Ok(t.f_to_device(dev)?) };
        Ok(Some(Self {
            n: picks.len(),
            vocab,
            ints: up(Tensor::from_slice(&ints))?,
            floats: up(Tensor::from_slice(&floats))?,
            int_len: [
                picks.len() as i64,
                masked.len() as i64,
                n_add,
                n_rep,
                n_pen,
                greedy.len() as i64,
                sampled.len() as i64,
            ],
        }))
    }

    /// The token picked for each pick from `logits` ([rows, vocab],
    /// float32, on the device the picks were prepared for); one copy to
    /// the host at the end.
    pub(crate) fn pick(&self, logits: &Tensor) -> Result<Vec<u32>, EngineError> {
        let (dev, vocab) = (logits.device(), self.vocab);
        if logits.size().get(1) != Some(&vocab) {
            return Err(EngineError::Step(format!(
                "logits of {:?} for picks over {vocab} tokens",
                logits.size()
            )));
        }
        let [n_rows, n_masked, n_add, n_rep, n_pen, n_greedy, n_sampled] = self.int_len;
        let mut at_i = 0;
        let mut int = |len: i64| -> Result<Tensor, EngineError> {
            let t = self.ints.f_narrow(0, at_i, len)?;
            at_i += len;
            Ok(t)
        };
        let rows = int(n_rows)?;
        let masked = int(n_masked)?;
        let add_at = int(n_add)?;
        let rep_at = int(n_rep)?;
        let pen_at = int(n_pen)?;
        let greedy = int(n_greedy)?;
        let sampled = int(n_sampled)?;
        let mut at_f = 0;
        let mut float = |len: i64| -> Result<Tensor, EngineError> {
            let t = self.floats.f_narrow(0, at_f, len)?;
            at_f += len;
            Ok(t)
        };
        let add_val = float(n_add)?;
        let rep_r = float(n_rep)?;
        let pen_val = float(n_pen)?;
        let col = |t: Tensor| -> Result<Tensor, EngineError> { Ok(t.f_view([n_sampled, 1])?) };
        let temperature = col(float(n_sampled)?)?;
        let top_k = col(float(n_sampled)?)?;
        let min_p = col(float(n_sampled)?)?;
        let top_p = col(float(n_sampled)?)?;
        let draw = col(float(n_sampled)?)?;
        let masks = float(n_masked * vocab)?;

        // A copy of the rows: processed in place below.
        let mut x = logits.f_index_select(0, &rows)?;
        let mut flat = x.f_view([-1])?;
        if n_masked > 0 {
            let _ = x.f_index_add_(0, &masked, &masks.f_view([n_masked, vocab])?)?;
        }
        if n_add > 0 {
            let _ = flat.f_index_put_(&[Some(&add_at)], &add_val, true)?;
        }
        if n_rep > 0 {
            let cur = flat.f_index_select(0, &rep_at)?;
            let pen = cur
                .f_div(&rep_r)?
                .f_where_self(&cur.f_gt(0.0)?, &cur.f_mul(&rep_r)?)?;
            let _ = flat.f_index_put_(&[Some(&rep_at)], &pen, false)?;
        }
        if n_pen > 0 {
            let _ = flat.f_index_put_(&[Some(&pen_at)], &pen_val, true)?;
        }
        let mut out = Tensor::f_zeros([self.n as i64], (Kind::Int64, dev))?;
        if n_greedy > 0 {
            // The host's argmax passes over NaN; torch's would take it.
            let xg = x.f_index_select(0, &greedy)?;
            let neg_inf = Tensor::f_scalar_tensor(f64::NEG_INFINITY, (Kind::Float, dev))?;
            let xg = neg_inf.f_where_self(&xg.f_isnan()?, &xg)?;
            let _ = out.f_index_copy_(0, &greedy, &xg.f_argmax(-1, false)?)?;
        }
        if n_sampled > 0 {
            let xs = x.f_index_select(0, &sampled)?;
            let params = Params {
                temperature,
                top_k,
                min_p,
                top_p,
                draw,
            };
            let _ = out.f_index_copy_(0, &sampled, &sample_rows(&xs, &params)?)?;
        }
        let host = out.f_to_device(Device::Cpu)?;
        let mut v = vec![0i64; self.n];
        host.f_copy_data(&mut v, self.n)?;
        Ok(v.into_iter().map(|t| t as u32).collect())
    }
}

/// The token picked for each of `picks` from `logits` ([rows, vocab],
/// float32, on any device).
#[cfg(test)]
pub(crate) fn pick(logits: &Tensor, picks: &[RowPick]) -> Result<Vec<u32>, EngineError> {
    match Prepared::new(picks, logits.size()[1], logits.device())? {
        Some(p) => p.pick(logits),
        None => Ok(Vec::new()),
    }
}

/// Sampled rows' parameters, [m, 1] each (float32 on the device).
struct Params {
    temperature: Tensor,
    top_k: Tensor,
    min_p: Tensor,
    top_p: Tensor,
    draw: Tensor,
}

/// Temperature, top-k, min-p, top-p and the draw for rows `x` ([m, vocab]);
/// the token id of each.
fn sample_rows(x: &Tensor, params: &Params) -> Result<Tensor, EngineError> {
    let dev = x.device();
    let (m, vocab) = (x.size()[0], x.size()[1]);
    let f64s = Kind::Double;
    let (min_p, top_p, r) = (
        params.min_p.f_to_kind(f64s)?,
        params.top_p.f_to_kind(f64s)?,
        params.draw.f_to_kind(f64s)?,
    );
    let neg_inf = Tensor::f_scalar_tensor(f64::NEG_INFINITY, (Kind::Float, dev))?;
    // The host drops non-finite logits (NaN, +-inf) before anything else.
    let scaled = x.f_div(&params.temperature)?;
    let scaled = scaled.f_where_self(&scaled.f_isfinite()?, &neg_inf)?;
    let (sorted, order) = scaled.f_sort_stable(true, -1, true)?;
    let pos = Tensor::f_arange(vocab, (Kind::Float, dev))?.f_view([1, vocab])?;
    let mut keep = sorted
        .f_isfinite()?
        .f_logical_and(&pos.f_lt_tensor(&params.top_k)?)?;
    let zero = Tensor::f_zeros([1], (f64s, dev))?;
    // Probabilities in f64, as the host computes them: exp of the f32
    // difference from the largest logit, renormalised after each filter.
    let renorm = |p: &Tensor| -> Result<Tensor, EngineError> {
        Ok(p.f_div(&p.f_sum_dim_intlist(-1, true, f64s)?)?)
    };
    let max = sorted.f_narrow(1, 0, 1)?;
    let p = sorted
        .f_sub(&max)?
        .f_to_kind(f64s)?
        .f_exp()?
        .f_where_self(&keep, &zero)?;
    let mut p = renorm(&p)?;
    // min-p: only rows that set it are renormalised (as on the host).
    let floor = min_p.f_mul(&p.f_narrow(1, 0, 1)?)?;
    let keep_min = p.f_ge_tensor(&floor)?;
    let on = min_p.f_gt(0.0)?;
    let cut = renorm(&p.f_where_self(&keep_min, &zero)?)?;
    p = cut.f_where_self(&on, &p)?;
    keep = keep.f_logical_and(&on.f_logical_not()?.f_logical_or(&keep_min)?)?;
    // top-p: keep a token while the probability before it is under top_p.
    let cum = p.f_cumsum(-1, f64s)?;
    let before = Tensor::f_cat(
        &[
            Tensor::f_zeros([m, 1], (f64s, dev))?,
            cum.f_narrow(1, 0, vocab - 1)?,
        ],
        1,
    )?;
    let keep_top = before.f_lt_tensor(&top_p)?;
    let on = top_p.f_lt(1.0)?;
    let cut = renorm(&p.f_where_self(&keep_top, &zero)?)?;
    p = cut.f_where_self(&on, &p)?;
    keep = keep.f_logical_and(&on.f_logical_not()?.f_logical_or(&keep_top)?)?;
    // The first token whose cumulative probability exceeds r; past the end
    // (rounding), the last one kept.
    let cum = p.f_cumsum(-1, f64s)?;
    let at = cum
        .f_le_tensor(&r)?
        .f_sum_dim_intlist(-1, true, Kind::Int64)?;
    let last = keep
        .f_sum_dim_intlist(-1, true, Kind::Int64)?
        .f_sub_scalar(1)?
        .f_clamp_min(0)?;
    let at = at.f_minimum(&last)?;
    Ok(order.f_gather(1, &at, false)?.f_view([m])?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::{Sampler, Sampling};

    /// Logits with structure: a few strong tokens, many weak, exact ties,
    /// a -inf and a NaN.
    fn logits(rows: i64, vocab: i64, seed: i64) -> Tensor {
        tch::manual_seed(seed);
        let x = Tensor::randn([rows, vocab], (Kind::Float, Device::Cpu)) * 2.0;
        let _ = x.narrow(1, 0, 8).fill_(3.5);
        let _ = x.narrow(1, 20, 1).fill_(f64::NEG_INFINITY);
        let _ = x.narrow(1, 21, 1).fill_(f64::NAN);
        x
    }

    fn settings() -> Vec<Sampling> {
        let s = |temperature: f32, top_p: f32, top_k: u32, min_p: f32| Sampling {
            temperature,
            top_p,
            top_k,
            min_p,
            ..Sampling::default()
        };
        vec![
            s(0.0, 1.0, 0, 0.0),
            s(1.0, 1.0, 0, 0.0),
            s(0.7, 1.0, 0, 0.0),
            s(1.3, 0.9, 0, 0.0),
            s(1.0, 0.5, 0, 0.0),
            s(1.0, 1.0, 5, 0.0),
            s(1.0, 1.0, 1, 0.0),
            s(1.0, 1.0, 0, 0.1),
            s(0.8, 0.95, 40, 0.05),
            Sampling {
                repetition_penalty: 1.3,
                ..s(1.0, 1.0, 0, 0.0)
            },
            Sampling {
                repetition_penalty: 1.5,
                ..s(0.0, 1.0, 0, 0.0)
            },
            Sampling {
                presence_penalty: 0.8,
                frequency_penalty: 0.6,
                ..s(1.0, 0.9, 0, 0.0)
            },
            Sampling {
                frequency_penalty: 1.5,
                ..s(0.0, 1.0, 0, 0.0)
            },
            Sampling {
                logit_bias: vec![(3, -100.0), (100, 6.0), (5, 2.0), (99_999, 5.0)],
                ..s(1.0, 1.0, 0, 0.0)
            },
            Sampling {
                logit_bias: vec![(7, 100.0)],
                repetition_penalty: 1.2,
                presence_penalty: 0.5,
                ..s(0.9, 0.8, 20, 0.02)
            },
        ]
    }

    /// The device path (here on CPU tensors) picks exactly what the host
    /// sampler picks: every setting, 40 seeds, 12 tokens each with the
    /// penalties evolving, rows batched with other requests' rows, with and
    /// without suppressed tokens and a constraint-style mask.
    #[test]
    fn device_picks_equal_host_picks() {
        let (rows, vocab) = (12i64, 600i64);
        let x = logits(rows, vocab, 11);
        let flat: Vec<f32> = Vec::<f32>::try_from(x.reshape([-1])).expect("floats");
        let prompt: Vec<u32> = vec![0, 1, 2, 50, 51, 300];
        let mask: Vec<f32> = (0..vocab)
            .map(|t| if t % 3 == 0 { 0.0 } else { f32::NEG_INFINITY })
            .collect();
        let mut picks = 0;
        let mut sampled = 0;
        for (si, cfg) in settings().into_iter().enumerate() {
            for seed in 0..40u64 {
                let with = |seed| {
                    Sampler::new(Sampling {
                        seed: Some(seed),
                        ..cfg.clone()
                    })
                    .with_prompt(&prompt)
                };
                let (mut host, mut dev) = (with(seed), with(seed));
                // A second request batched beside it (another seed).
                let (mut host2, mut dev2) = (with(seed + 1000), with(seed + 1000));
                let suppress: Vec<u32> = if seed % 2 == 0 { vec![0, 1] } else { vec![] };
                let masked = seed % 5 == 4;
                for step in 0..12i64 {
                    let row = (step + si as i64) % rows;
                    let row2 = (row + 1) % rows;
                    let slice = |r: i64| &flat[(r * vocab) as usize..((r + 1) * vocab) as usize];
                    let mut h = slice(row).to_vec();
                    if masked {
                        h.iter_mut().zip(&mask).for_each(|(a, b)| *a += b);
                    }
                    let want = host.sample(&h, if masked { &[] } else { &suppress });
                    let want2 = host2.sample(slice(row2), &[]);
                    let plan = dev.device_plan(
                        row,
                        if masked { &[] } else { &suppress },
                        masked.then(|| mask.clone()),
                        vocab as usize,
                    );
                    sampled += usize::from(plan.draw.is_some());
                    let plan2 = dev2.device_plan(row2, &[], None, vocab as usize);
                    let got = pick(&x, &[plan, plan2]).expect("pick");
                    dev.record(got[0]);
                    dev2.record(got[1]);
                    assert_eq!(
                        (got[0], got[1]),
                        (want, want2),
                        "setting {si} {cfg:?}, seed {seed}, step {step}"
                    );
                    picks += 2;
                }
            }
        }
        assert_eq!(picks, 15 * 40 * 12 * 2);
        assert!(sampled > 4000, "only {sampled} sampled (not greedy) picks");
    }

    #[test]
    fn greedy_takes_the_first_maximum_and_honours_bias() {
        let x = Tensor::from_slice(&[1.0f32, 3.0, 3.0, 0.5]).view([1, 4]);
        let plan = |additive: Vec<(u32, f32)>| RowPick {
            row: 0,
            mask: None,
            additive,
            repetition: None,
            penalties: Vec::new(),
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            draw: None,
        };
        assert_eq!(pick(&x, &[plan(vec![])]).expect("pick"), vec![1]);
        assert_eq!(
            pick(
                &x,
                &[plan(vec![(1, f32::NEG_INFINITY)]), plan(vec![(3, 5.0)])]
            )
            .expect("pick"),
            vec![2, 3]
        );
        // The logits themselves are untouched.
        assert_eq!(pick(&x, &[plan(vec![])]).expect("pick"), vec![1]);
    }
}
