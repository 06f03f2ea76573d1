//! Rotary position embeddings: the tables of one rope configuration
//! (default, `linear`, `llama3`, Phi-3's `longrope`; partial rotary as the
//! rotated width), and their application to query and key heads, as
//! transformers computes them.
//!
//! Longrope keeps two tables, short and long factors, and rotates a whole
//! sequence with one of them, as transformers' Phi-3 does in `generate`:
//! the short table while the sequence is at most
//! `original_max_position_embeddings` tokens long, the long one beyond. A
//! prompt longer than that is rotated with the long table throughout, in
//! whatever chunks it is prefilled; a sequence that grows past it while
//! decoding has its cache recomputed with the long table, as transformers
//! drops its cache at that point (`prepare_inputs_for_generation`). The
//! table is the model's KV regime (`Model::kv_regime`): the worker
//! recomputes a sequence whose regime changed and keeps regimes apart in
//! the prefix cache.

use tch::{Device, Kind, Tensor};

use super::batch::StepBatch;
use crate::EngineError;
use crate::config::{LongRopeScaling, RopeScaling};

/// cos/sin tables [max_positions, rot_dim] (float32) of one rope setting;
/// for longrope, [2 * max_positions, rot_dim]: the short table, then the long.
pub(crate) struct Rope {
    cos: Tensor,
    sin: Tensor,
    rot_dim: i64,
    /// Longrope: `original_max_position_embeddings` and the long table's
    /// first row.
    long: Option<(i64, i64)>,
}

/// The tables at one step's positions, [N, 1, rot_dim] (float32), and,
/// made by the first layer that rotates, the same cast to the activations'
/// kind with the sign of `rotate_half` folded into the sine (so every
/// later layer of the step reuses them: fewer kernels per layer).
pub(crate) struct RopeAt {
    cos: Tensor,
    sin: Tensor,
    rot_dim: i64,
    cast: std::cell::OnceCell<(Kind, Tensor, Tensor)>,
}

impl Rope {
    /// Tables for `rot_dim` rotated dimensions of each head (the head
    /// dimension, or less for partial rotary) with base `theta`.
    pub fn new(
        theta: f64,
        scaling: &RopeScaling,
        rot_dim: i64,
        max_positions: i64,
        device: Device,
    ) -> Result<Self, EngineError> {
        check_rot_dim(rot_dim)?;
        if let RopeScaling::LongRope(_) = scaling {
            // Only families that switch tables per step (`at_step`) take it.
            return Err(EngineError::Unsupported(
                "rope scaling type \"longrope\" in this family".into(),
            ));
        }
        let inv = inv_freq(theta, scaling, rot_dim)?;
        let (cos, sin) = tables(&inv, max_positions, 1.0)?;
        Ok(Self {
            cos: cos.f_to_device(device)?,
            sin: sin.f_to_device(device)?,
            rot_dim,
            long: None,
        })
    }

    /// Tables for `scaling`, which may be longrope (read per step with
    /// [`Rope::at_step`]).
    pub fn with_longrope(
        theta: f64,
        scaling: &RopeScaling,
        rot_dim: i64,
        max_positions: i64,
        device: Device,
    ) -> Result<Self, EngineError> {
        let RopeScaling::LongRope(s) = scaling else {
            return Self::new(theta, scaling, rot_dim, max_positions, device);
        };
        check_rot_dim(rot_dim)?;
        let short = longrope_inv_freq(theta, &s.short_factor, rot_dim, "short_factor")?;
        let long = longrope_inv_freq(theta, &s.long_factor, rot_dim, "long_factor")?;
        let (cs, ss) = tables(&short, max_positions, s.attention_factor)?;
        let (cl, sl) = tables(&long, max_positions, s.attention_factor)?;
        Ok(Self {
            cos: Tensor::f_cat(&[cs, cl], 0)?.f_to_device(device)?,
            sin: Tensor::f_cat(&[ss, sl], 0)?.f_to_device(device)?,
            rot_dim,
            long: Some((s.original_max_position_embeddings, max_positions)),
        })
    }

    /// The tables at the positions of a step's tokens; with longrope, each
    /// sequence's tokens read the table of its regime (see the module
    /// comment).
    pub fn at_step(&self, batch: &StepBatch) -> Result<RopeAt, EngineError> {
        let Some((original, offset)) = self.long else {
            return self.at(&batch.pos);
        };
        let spans: Vec<(i64, i64, usize)> = batch
            .seqs
            .iter()
            .map(|s| (s.start, s.len as i64, s.seq_len))
            .collect();
        let rows = longrope_rows(&spans, original, offset);
        let rows = Tensor::from_slice(&rows).f_to_device(batch.pos.device())?;
        self.at(&rows)
    }

    /// Whether rotation depends on each sequence's length (longrope).
    pub fn is_longrope(&self) -> bool {
        self.long.is_some()
    }

    /// Which table a sequence of `seq_len` tokens is rotated with: 1 for
    /// longrope's long table, else 0.
    pub fn regime(&self, seq_len: usize) -> u8 {
        match self.long {
            Some((original, _)) if seq_len as i64 > original => 1,
            _ => 0,
        }
    }

    /// The tables at positions `pos` ([N], int64 on the model's device).
    pub fn at(&self, pos: &Tensor) -> Result<RopeAt, EngineError> {
        Ok(RopeAt {
            cos: self.cos.f_index_select(0, pos)?.f_unsqueeze(1)?,
            sin: self.sin.f_index_select(0, pos)?.f_unsqueeze(1)?,
            rot_dim: self.rot_dim,
            cast: std::cell::OnceCell::new(),
        })
    }
}

impl RopeAt {
    /// `x * cos + rotate_half(x) * sin` on the first `rot_dim` dimensions
    /// of each head of `x` [N, heads, head_dim]; the rest pass unchanged.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor, EngineError> {
        let hd = x.size()[2];
        let (cos, sin) = self.tables(x.kind())?;
        if self.rot_dim == hd {
            return rotate(x, &cos, &sin);
        }
        let rot = rotate(&x.f_narrow(2, 0, self.rot_dim)?, &cos, &sin)?;
        let pass = x.f_narrow(2, self.rot_dim, hd - self.rot_dim)?;
        Ok(Tensor::f_cat(&[rot, pass], 2)?)
    }

    /// Splits a fused projection `qkv` [N, (heads + 2 kv_heads) * head_dim]
    /// into query, key and value heads, the query and key heads rotated in
    /// one pass (the same arithmetic as rotating each).
    pub fn apply_qkv(
        &self,
        qkv: &Tensor,
        heads: i64,
        kv_heads: i64,
        head_dim: i64,
    ) -> Result<(Tensor, Tensor, Tensor), EngineError> {
        let n = qkv.size()[0];
        let all = qkv.f_view([n, heads + 2 * kv_heads, head_dim])?;
        let qk = self.apply(&all.f_narrow(1, 0, heads + kv_heads)?)?;
        Ok((
            qk.f_narrow(1, 0, heads)?,
            qk.f_narrow(1, heads, kv_heads)?,
            all.f_narrow(1, heads + kv_heads, kv_heads)?,
        ))
    }

    /// Whether the tables rotate all `head_dim` dimensions of a head.
    pub fn rotates_all(&self, head_dim: i64) -> bool {
        self.rot_dim == head_dim
    }

    /// cos and the signed sine in `kind`, made once per step.
    pub(crate) fn tables(&self, kind: Kind) -> Result<(Tensor, Tensor), EngineError> {
        if let Some((k, c, s)) = self.cast.get()
            && *k == kind
        {
            return Ok((c.shallow_clone(), s.shallow_clone()));
        }
        let half = self.rot_dim / 2;
        let cos = self.cos.f_to_kind(kind)?;
        let sin = self.sin.f_to_kind(kind)?;
        // rotate_half(x) * sin = cat(-x2, x1) * sin = cat(x2, x1) * cat(-sin1, sin2):
        // negation is exact, so the products are the same numbers.
        let signed = Tensor::f_cat(
            &[
                sin.f_narrow(2, 0, half)?.f_neg()?,
                sin.f_narrow(2, half, half)?,
            ],
            2,
        )?;
        if self.cast.get().is_none() {
            let _ = self
                .cast
                .set((kind, cos.shallow_clone(), signed.shallow_clone()));
        }
        Ok((cos, signed))
    }
}

/// Table rows of each (start, len, seq_len) span's positions: the long
/// table (rows from `offset`) for a sequence longer than `original`
/// (transformers' `max(position_ids) + 1 > original` over the whole
/// sequence), else the short one.
fn longrope_rows(spans: &[(i64, i64, usize)], original: i64, offset: i64) -> Vec<i64> {
    let mut rows = Vec::new();
    for &(start, len, seq_len) in spans {
        let end = start + len;
        let base = if seq_len as i64 > original { offset } else { 0 };
        rows.extend((start..end).map(|p| p + base));
    }
    rows
}

fn check_rot_dim(rot_dim: i64) -> Result<(), EngineError> {
    if rot_dim <= 0 || rot_dim % 2 != 0 {
        return Err(EngineError::Unsupported(format!(
            "rotary dimension {rot_dim} (must be even and positive)"
        )));
    }
    Ok(())
}

/// cos and sin [max_positions, rot_dim] of inverse frequencies `inv`,
/// times `scale` (transformers' `attention_scaling`) when it is not 1.
fn tables(inv: &Tensor, max_positions: i64, scale: f64) -> Result<(Tensor, Tensor), EngineError> {
    let t = Tensor::f_arange(max_positions, (Kind::Float, Device::Cpu))?;
    let freqs = t.f_unsqueeze(1)?.f_mul(&inv.f_unsqueeze(0)?)?;
    let emb = Tensor::f_cat(&[&freqs, &freqs], 1)?;
    let (cos, sin) = (emb.f_cos()?, emb.f_sin()?);
    if scale == 1.0 {
        return Ok((cos, sin));
    }
    Ok((cos.f_mul_scalar(scale)?, sin.f_mul_scalar(scale)?))
}

/// Longrope's inverse frequencies for one factor list, as transformers:
/// `1 / (factors * theta ** (arange(0, dim, 2) / dim))` in float32.
fn longrope_inv_freq(
    theta: f64,
    factors: &[f64],
    dim: i64,
    name: &str,
) -> Result<Tensor, EngineError> {
    if factors.len() as i64 != dim / 2 {
        return Err(EngineError::Unsupported(format!(
            "longrope {name} of {} values for {dim} rotary dimensions (needs {})",
            factors.len(),
            dim / 2
        )));
    }
    let exponent = Tensor::f_arange_start_step(0, dim, 2, (Kind::Int64, Device::Cpu))?
        .f_to_kind(Kind::Float)?
        .f_div_scalar(dim as f64)?;
    let ext = Tensor::from_slice(factors).f_to_kind(Kind::Float)?;
    let base = Tensor::from(theta as f32).f_pow(&exponent)?;
    Ok(ext.f_mul(&base)?.f_reciprocal()?)
}

/// `x * cos + rotate_half(x) * sin`, with `signed_sin` the sine whose
/// first half is negated (see `RopeAt::tables`); tables already in x's kind.
fn rotate(x: &Tensor, cos: &Tensor, signed_sin: &Tensor) -> Result<Tensor, EngineError> {
    let half = x.size()[2] / 2;
    let x1 = x.f_narrow(2, 0, half)?;
    let x2 = x.f_narrow(2, half, half)?;
    let swapped = Tensor::f_cat(&[x2, x1], 2)?;
    Ok(x.f_mul(cos)?.f_add(&swapped.f_mul(signed_sin)?)?)
}

/// Inverse frequencies exactly as transformers computes them (float32 tensor
/// ops), with the configured scaling.
fn inv_freq(theta: f64, scaling: &RopeScaling, dim: i64) -> Result<Tensor, EngineError> {
    let exponent = Tensor::f_arange_start_step(0, dim, 2, (Kind::Int64, Device::Cpu))?
        .f_to_kind(Kind::Float)?
        .f_div_scalar(dim as f64)?;
    let base = Tensor::from(theta as f32);
    let inv = base.f_pow(&exponent)?.f_reciprocal()?;
    let s = match scaling {
        RopeScaling::None => return Ok(inv),
        RopeScaling::Linear { factor } => return Ok(inv.f_div_scalar(*factor)?),
        RopeScaling::Llama3(s) => s,
        RopeScaling::LongRope(LongRopeScaling { .. }) => {
            return Err(EngineError::Unsupported(
                "rope scaling type \"longrope\" without its tables".into(),
            ));
        }
    };
    let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
    let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
    let wavelen = inv
        .f_reciprocal()?
        .f_mul_scalar(2.0 * std::f64::consts::PI)?;
    let scaled = inv
        .f_div_scalar(s.factor)?
        .f_where_self(&wavelen.f_gt(low_wavelen)?, &inv)?;
    let smooth = wavelen
        .f_reciprocal()?
        .f_mul_scalar(s.original_max_position_embeddings)?
        .f_sub_scalar(s.low_freq_factor)?
        .f_div_scalar(s.high_freq_factor - s.low_freq_factor)?;
    let one_minus = smooth.f_neg()?.f_add_scalar(1.0)?;
    let smoothed = one_minus
        .f_mul(&scaled.f_div_scalar(s.factor)?)?
        .f_add(&smooth.f_mul(&scaled)?)?;
    let medium = wavelen
        .f_lt(high_wavelen)?
        .f_logical_not()?
        .f_logical_and(&wavelen.f_gt(low_wavelen)?.f_logical_not()?)?;
    Ok(smoothed.f_where_self(&medium, &scaled)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(scaling: &RopeScaling, rot: i64) -> Rope {
        Rope::new(10_000.0, scaling, rot, 64, Device::Cpu).expect("rope")
    }

    /// Linear scaling by f at position p is the default rope at p / f.
    #[test]
    fn linear_scaling_divides_positions() {
        let (plain, lin) = (
            table(&RopeScaling::None, 16),
            table(&RopeScaling::Linear { factor: 4.0 }, 16),
        );
        let diff = (lin.cos.get(32) - plain.cos.get(8)).abs().max();
        assert!(diff.double_value(&[]) < 1e-5, "cos differs by {diff}");
        let diff = (lin.cos.get(5) - plain.cos.get(5)).abs().max();
        assert!(diff.double_value(&[]) > 1e-3, "scaling changed nothing");
    }

    /// Longrope reads the long table for every token of a sequence longer
    /// than the original length, wherever its chunk starts and ends, and
    /// the short table otherwise.
    #[test]
    fn longrope_picks_the_table_by_the_whole_sequence_length() {
        let spans = [(0, 3, 3), (0, 3, 65), (62, 2, 64), (64, 1, 65), (10, 2, 80)];
        let rows = longrope_rows(&spans, 64, 1000);
        assert_eq!(rows, [0, 1, 2, 1000, 1001, 1002, 62, 63, 1064, 1010, 1011]);
    }

    /// Longrope tables: short and long factors divide the frequencies, and
    /// both tables are scaled by the attention factor.
    #[test]
    fn longrope_tables_scale_frequencies_and_amplitude() {
        let s = crate::config::LongRopeScaling {
            short_factor: vec![1.0, 2.0],
            long_factor: vec![4.0, 8.0],
            original_max_position_embeddings: 8,
            attention_factor: 1.5,
        };
        let r = Rope::with_longrope(10_000.0, &RopeScaling::LongRope(s), 4, 16, Device::Cpu)
            .expect("rope");
        let inv = |f: f64, i: i32| 1.0 / (f * 10_000f64.powf(f64::from(i) * 2.0 / 4.0));
        for (row, factors) in [(5i64, [1.0, 2.0]), (16 + 5, [4.0, 8.0])] {
            for (i, f) in factors.iter().enumerate() {
                let want = 1.5 * (5.0 * inv(*f, i as i32)).cos();
                let got = r.cos.double_value(&[row, i as i64]);
                assert!(
                    (got - want).abs() < 1e-5,
                    "row {row} dim {i}: {got} vs {want}"
                );
            }
        }
    }

    /// Partial rotary rotates the first dimensions like a full rope of that
    /// width and leaves the others as they were.
    #[test]
    fn partial_rotary_passes_the_tail() {
        tch::manual_seed(3);
        let x = Tensor::randn([5, 2, 16], (Kind::Float, Device::Cpu));
        let pos = Tensor::from_slice(&[0i64, 3, 7, 20, 63]);
        let partial = table(&RopeScaling::None, 8).at(&pos).expect("at");
        let full8 = table(&RopeScaling::None, 8).at(&pos).expect("at");
        let got = partial.apply(&x).expect("apply");
        let head = full8.apply(&x.narrow(2, 0, 8).contiguous()).expect("apply");
        assert_eq!(got.narrow(2, 0, 8), head);
        assert_eq!(got.narrow(2, 8, 8), x.narrow(2, 8, 8));
        assert_ne!(got.narrow(2, 0, 8), x.narrow(2, 0, 8));
    }
}
