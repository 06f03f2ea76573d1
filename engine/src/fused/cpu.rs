//! The same ops on the CPU in float32, over the tensors' memory (the
//! dispatchers in `fused.rs` check `cpu_usable`). Each computes what the libtorch ops it
//! replaces compute: the rotary outputs and the copies into the pool bit
//! for bit; the norm's sum of squares in float64 (libtorch sums in float32,
//! in another order); SiLU with `attn`'s vectorisable `exp`.

use tch::{Kind, Tensor};

use crate::EngineError;
use crate::attn::{f32_tensor, f32_view};
use crate::simd::{Simd, simd};

fn rows_of(x: &Tensor) -> (usize, usize) {
    let width = x.size().last().copied().unwrap_or(0).max(0) as usize;
    (x.numel().checked_div(width).unwrap_or(0), width)
}

/// [`super::cuda_add_rms_norm`]'s arithmetic on the CPU in float32.
pub(crate) fn add_rms_norm(
    x: &Tensor,
    delta: Option<&Tensor>,
    w: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor), EngineError> {
    let (rows, hidden) = rows_of(x);
    let (xs, ws) = (f32_view(x)?, f32_view(w)?);
    let ds = delta.map(f32_view).transpose()?;
    if ws.len() != hidden || ds.is_some_and(|d| d.len() != xs.len()) {
        return Err(EngineError::Step("rms_norm: shapes do not agree".into()));
    }
    let shape = x.size();
    let opts = (tch::Kind::Float, tch::Device::Cpu);
    let h = Tensor::f_empty(shape.as_slice(), opts)?;
    let sum = match ds {
        Some(_) => Some(Tensor::f_empty(shape.as_slice(), opts)?),
        None => None,
    };
    if !xs.is_empty() {
        #[allow(unsafe_code)]
        // SAFETY: `h` and `sum` are fresh contiguous float32 CPU tensors of
        // x's shape (xs.len() > 0 elements), referenced nowhere else until
        // returned; `norm_rows` writes every element of both.
        let (hs, ss) = unsafe {
            let out =
                |t: &Tensor| std::slice::from_raw_parts_mut(t.data_ptr().cast::<f32>(), xs.len());
            (out(&h), sum.as_ref().map(out))
        };
        let args = NormArgs {
            xs,
            ds,
            ws,
            eps: eps as f32,
            hidden,
        };
        norm_rows_simd(&args, rows, hs, ss);
    }
    Ok((sum.unwrap_or_else(|| x.shallow_clone()), h))
}

/// [`add_rms_norm`] over slices (the row path, `layers::rows`): `h` the
/// norm of each row of `xs` (+ `ds`), with the sum written to `sum`
/// where `ds` is given; rows of `ws.len()` floats.
pub(crate) fn add_rms_norm_to(
    xs: &[f32],
    ds: Option<&[f32]>,
    ws: &[f32],
    eps: f64,
    h: &mut [f32],
    sum: Option<&mut [f32]>,
) -> Result<(), EngineError> {
    let hidden = ws.len();
    let n = xs.len();
    if hidden == 0
        || !n.is_multiple_of(hidden)
        || h.len() != n
        || ds.is_some() != sum.is_some()
        || ds.is_some_and(|d| d.len() != n)
        || sum.as_ref().is_some_and(|s| s.len() != n)
    {
        return Err(EngineError::Step("rms_norm: shapes do not agree".into()));
    }
    let args = NormArgs {
        xs,
        ds,
        ws,
        eps: eps as f32,
        hidden,
    };
    norm_rows_simd(&args, n / hidden, h, sum);
    Ok(())
}

/// Gemma's per-head query and key norms of `qkv` [n, (heads + 2
/// kv_heads) x head_dim]: a new tensor of its shape with each query head
/// normalised as [`add_rms_norm`] does (no delta) with the weight `q_w`,
/// each key head with `k_w`, and the values copied.
#[allow(clippy::too_many_arguments)]
pub(crate) fn head_norms(
    qkv: &Tensor,
    q_w: &Tensor,
    k_w: &Tensor,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    eps: f64,
) -> Result<Tensor, EngineError> {
    let (_, width) = rows_of(qkv);
    let (xs, qw, kw) = (f32_view(qkv)?, f32_view(q_w)?, f32_view(k_w)?);
    if width as i64 != (heads + 2 * kv_heads) * head_dim {
        return Err(EngineError::Step("head_norms: shapes do not agree".into()));
    }
    let out = Tensor::f_empty(qkv.size().as_slice(), (Kind::Float, tch::Device::Cpu))?;
    if xs.is_empty() {
        return Ok(out);
    }
    #[allow(unsafe_code)]
    // SAFETY: `out` is a fresh contiguous float32 CPU tensor of qkv's shape
    // (xs.len() > 0 elements), referenced nowhere else until returned;
    // `head_norms_to` writes every element (or fails its checks first).
    let os = unsafe { std::slice::from_raw_parts_mut(out.data_ptr().cast::<f32>(), xs.len()) };
    head_norms_to(xs, qw, kw, heads, kv_heads, head_dim, eps, os)?;
    Ok(out)
}

/// [`head_norms`] over slices (the row path, `layers::rows`): `xs` rows of
/// (heads + 2 kv_heads) x head_dim into `os`, the same shape.
#[allow(clippy::too_many_arguments)]
pub(crate) fn head_norms_to(
    xs: &[f32],
    qw: &[f32],
    kw: &[f32],
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    eps: f64,
    os: &mut [f32],
) -> Result<(), EngineError> {
    let [h, kvh, hd] = [heads, kv_heads, head_dim].map(|v| v.max(0) as usize);
    let width = (h + 2 * kvh) * hd;
    if width == 0
        || !xs.len().is_multiple_of(width)
        || os.len() != xs.len()
        || qw.len() != hd
        || kw.len() != hd
    {
        return Err(EngineError::Step("head_norms: shapes do not agree".into()));
    }
    for (x, o) in xs.chunks_exact(width).zip(os.chunks_exact_mut(width)) {
        let (q_end, k_end) = (h * hd, (h + kvh) * hd);
        for (span, ws, n) in [(0..q_end, qw, h), (q_end..k_end, kw, kvh)] {
            let args = NormArgs {
                xs: &x[span.clone()],
                ds: None,
                ws,
                eps: eps as f32,
                hidden: hd,
            };
            norm_rows_simd(&args, n, &mut o[span], None);
        }
        o[k_end..].copy_from_slice(&x[k_end..]);
    }
    Ok(())
}

/// [`norm_rows`] with the widest SIMD build this CPU runs.
fn norm_rows_simd(args: &NormArgs<'_>, rows: usize, h: &mut [f32], sum: Option<&mut [f32]>) {
    match simd() {
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX-512F (checked at run time).
        Simd::Avx512 => unsafe { norm_rows_avx512(args, rows, h, sum) },
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        Simd::Avx2 => unsafe { norm_rows_avx2(args, rows, h, sum) },
        _ => norm_rows(args, rows, h, sum),
    }
}

struct NormArgs<'a> {
    xs: &'a [f32],
    ds: Option<&'a [f32]>,
    ws: &'a [f32],
    eps: f32,
    hidden: usize,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn norm_rows_avx512(a: &NormArgs<'_>, rows: usize, h: &mut [f32], sum: Option<&mut [f32]>) {
    norm_rows(a, rows, h, sum);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn norm_rows_avx2(a: &NormArgs<'_>, rows: usize, h: &mut [f32], sum: Option<&mut [f32]>) {
    norm_rows(a, rows, h, sum);
}

/// Each row: `sum = x + delta` (when there is a delta), then `h = w * (row
/// * inv)` with `inv = 1 / sqrt(mean of the row's squares + eps)`.
#[inline(always)]
fn norm_rows(a: &NormArgs<'_>, rows: usize, h: &mut [f32], mut sum: Option<&mut [f32]>) {
    let hidden = a.hidden;
    for r in 0..rows {
        let span = r * hidden..(r + 1) * hidden;
        let row: &[f32] = match (&mut sum, a.ds) {
            (Some(out), Some(d)) => {
                let o = &mut out[span.clone()];
                for ((o, x), y) in o.iter_mut().zip(&a.xs[span.clone()]).zip(&d[span.clone()]) {
                    *o = x + y;
                }
                o
            }
            _ => &a.xs[span.clone()],
        };
        let ss = sum_squares(row);
        let var = (ss / hidden as f64) as f32;
        let inv = 1.0 / (var + a.eps).sqrt();
        for ((o, &v), &wi) in h[span].iter_mut().zip(row).zip(a.ws) {
            *o = wi * (v * inv);
        }
    }
}

/// The sum of `row`'s squares (each squared in float32) in float64, over
/// eight interleaved partial sums (so the loop vectorises), added in a
/// fixed order.
#[inline(always)]
fn sum_squares(row: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let chunks = row.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().map(|&v| f64::from(v * v)).sum();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f64::from(v * v);
        }
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// [`super::cuda_rope_kv`] on the CPU: queries returned, keys and values
/// copied into the pool layer `k_cache`, `v_cache` at `slots`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rope_kv(
    qkv: &Tensor,
    cos: &Tensor,
    signed_sin: &Tensor,
    slots: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
) -> Result<Tensor, EngineError> {
    let (n, width) = rows_of(qkv);
    let (a, c, s) = (f32_view(qkv)?, f32_view(cos)?, f32_view(signed_sin)?);
    let slots: Vec<i64> = Vec::<i64>::try_from(slots)?;
    if slots.len() != n || width as i64 != (heads + 2 * kv_heads) * head_dim {
        return Err(EngineError::Step("rope_kv: shapes do not agree".into()));
    }
    let mut done = Ok(());
    let q = crate::attn::f32_tensor_written(&[n as i64, heads, head_dim], |qp| {
        // SAFETY: the fresh tensor holds n * heads * head_dim floats,
        // referenced nowhere else until returned; `rope_kv_to` writes
        // every one (or fails its checks first, and the tensor is dropped).
        #[allow(unsafe_code)]
        let q = unsafe { std::slice::from_raw_parts_mut(qp, n * (heads * head_dim) as usize) };
        done = rope_kv_to(
            a, c, s, &slots, k_cache, v_cache, heads, kv_heads, head_dim, q,
        );
    })?;
    done.map(|()| q)
}

/// [`rope_kv`] over slices (the row path, `layers::rows`): the rotated
/// queries of `a` ([n, (heads + 2 kv_heads) x head_dim]) into `q` ([n,
/// heads, head_dim]), keys and values into the pool at `slots`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rope_kv_to(
    a: &[f32],
    c: &[f32],
    s: &[f32],
    slots: &[i64],
    k_cache: &Tensor,
    v_cache: &Tensor,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    q: &mut [f32],
) -> Result<(), EngineError> {
    let (h, kvh, d) = (heads as usize, kv_heads as usize, head_dim as usize);
    let width = (h + 2 * kvh) * d;
    let n = slots.len();
    let pool_rows = k_cache.size().first().copied().unwrap_or(0);
    if a.len() != n * width
        || q.len() != n * h * d
        || c.len() != n * d
        || s.len() != c.len()
        || d % 2 != 0
        || k_cache.size() != [pool_rows, kv_heads, head_dim]
        || v_cache.size() != k_cache.size()
        || slots.iter().any(|&sl| sl < 0 || sl >= pool_rows)
    {
        return Err(EngineError::Step("rope_kv: shapes do not agree".into()));
    }
    let f16_pool = k_cache.kind() == Kind::Half;
    let (kp, vp) = (pool_ptr(k_cache)?, pool_ptr(v_cache)?);
    // A float16 pool: each key and value head rounded from float32 here
    // (as libtorch's conversion rounds: to nearest, ties to even).
    let mut wide = vec![0f32; if f16_pool { d } else { 0 }];
    let mut token = |t: usize, q: &mut [f32]| {
        let row = &a[t * width..(t + 1) * width];
        let (ct, st) = (&c[t * d..(t + 1) * d], &s[t * d..(t + 1) * d]);
        let base = slots[t] as usize * kvh * d;
        for head in 0..h + 2 * kvh {
            let x = &row[head * d..(head + 1) * d];
            if head < h {
                rotate(x, ct, st, &mut q[(t * h + head) * d..][..d]);
                continue;
            }
            let (pool, at) = if head < h + kvh {
                (kp, base + (head - h) * d)
            } else {
                (vp, base + (head - h - kvh) * d)
            };
            let rotated = head < h + kvh;
            if f16_pool {
                let dst = pool.cast::<half::f16>();
                // SAFETY (this and the float32 case): `kp` and `vp` are the
                // data of contiguous CPU tensors [pool_rows, kv_heads,
                // head_dim] of the pool's kind (checked), with slot <
                // pool_rows and the head's kv < kv_heads, so the d elements
                // lie inside. Each is borrowed for its head alone, one head
                // at a time; the pool is reached through `&mut KvPool` by
                // the caller, so nothing reads it meanwhile, and `x` (the
                // step's qkv) is not the pool.
                #[allow(unsafe_code)]
                let out = unsafe { std::slice::from_raw_parts_mut(dst.add(at), d) };
                let src = if rotated {
                    rotate(x, ct, st, &mut wide);
                    &wide[..]
                } else {
                    x
                };
                use half::slice::HalfFloatSliceExt;
                out.convert_from_f32_slice(src);
            } else {
                #[allow(unsafe_code)]
                let out = unsafe { std::slice::from_raw_parts_mut(pool.cast::<f32>().add(at), d) };
                if rotated {
                    rotate(x, ct, st, out);
                } else {
                    out.copy_from_slice(x);
                }
            }
        }
    };
    for t in 0..n {
        token(t, q);
    }
    Ok(())
}

/// One head rotated: `x * cos + rotate_half(x) * signed_sin`, each half in
/// its own loop so that both vectorise (the same products and sum per
/// element as the formula, so the same bits).
fn rotate(x: &[f32], c: &[f32], s: &[f32], out: &mut [f32]) {
    match simd() {
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX-512F (checked at run time).
        Simd::Avx512 => unsafe { rotate_avx512(x, c, s, out) },
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        Simd::Avx2 => unsafe { rotate_avx2(x, c, s, out) },
        _ => rotate_halves(x, c, s, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn rotate_avx512(x: &[f32], c: &[f32], s: &[f32], out: &mut [f32]) {
    rotate_halves(x, c, s, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn rotate_avx2(x: &[f32], c: &[f32], s: &[f32], out: &mut [f32]) {
    rotate_halves(x, c, s, out);
}

#[inline(always)]
fn rotate_halves(x: &[f32], c: &[f32], s: &[f32], out: &mut [f32]) {
    let half = x.len() / 2;
    assert!(
        x.len() == 2 * half && c.len() == x.len() && s.len() == x.len() && out.len() == x.len()
    );
    let (x1, x2) = x.split_at(half);
    let (c1, c2) = c.split_at(half);
    let (s1, s2) = s.split_at(half);
    let (o1, o2) = out.split_at_mut(half);
    // Zipped, so that no index is bounds-checked and both loops vectorise
    // (indexed, each element took scalar loads behind a check).
    for (o, ((&a, &b), (&cv, &sv))) in o1.iter_mut().zip(x1.iter().zip(x2).zip(c1.iter().zip(s1))) {
        *o = a * cv + b * sv;
    }
    for (o, ((&b, &a), (&cv, &sv))) in o2.iter_mut().zip(x2.iter().zip(x1).zip(c2.iter().zip(s2))) {
        *o = b * cv + a * sv;
    }
}

/// The data of a KV pool layer: a contiguous float32 or float16 CPU
/// tensor.
fn pool_ptr(t: &Tensor) -> Result<*mut u8, EngineError> {
    if t.kind() == Kind::Half {
        crate::attn::kv_view::<half::f16>(t)?;
    } else {
        f32_view(t)?;
    }
    Ok(t.data_ptr().cast::<u8>())
}

/// [`super::cuda_silu_mul`] on the CPU.
pub(crate) fn silu_mul(gu: &Tensor, inter: i64) -> Result<Tensor, EngineError> {
    let (n, width) = rows_of(gu);
    let i = inter as usize;
    if width != 2 * i {
        return Err(EngineError::Step("silu_mul: shapes do not agree".into()));
    }
    let a = f32_view(gu)?;
    f32_tensor(&[n as i64, inter], |out| {
        match simd() {
            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX-512F (checked at run time).
            Simd::Avx512 => unsafe { silu_rows_avx512(a, out, i, width) },
            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX2 and FMA (checked at run time).
            Simd::Avx2 => unsafe { silu_rows_avx2(a, out, i, width) },
            _ => silu_rows(a, out, i, width),
        }
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn silu_rows_avx512(a: &[f32], out: &mut [f32], i: usize, width: usize) {
    silu_rows(a, out, i, width);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn silu_rows_avx2(a: &[f32], out: &mut [f32], i: usize, width: usize) {
    silu_rows(a, out, i, width);
}

/// `out` row r = silu(gate) * up of row r of `a` (`width` = 2 i values,
/// gate first). The sigmoid from `e = exp(-|g|)` (never above 1, so the
/// branch-free exponential of `attn` serves, and the loop vectorises):
/// `1 / (1 + e)` for g >= 0, `e / (1 + e)` below.
#[inline(always)]
fn silu_rows(a: &[f32], out: &mut [f32], i: usize, width: usize) {
    for (r, o) in out.chunks_mut(i.max(1)).enumerate() {
        let (g, u) = a[r * width..(r + 1) * width].split_at(i);
        silu_mul_slice(g, u, o);
    }
}

/// `out[j] = silu(g[j]) * u[j]` (see [`silu_rows`]); also the packed
/// gate/up product's epilogue (`crate::gemm`), to the bit the same.
#[inline(always)]
pub(crate) fn silu_mul_slice(g: &[f32], u: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        let e = crate::attn::exp(-g.abs());
        let num = if g >= 0.0 { 1.0 } else { e };
        *o = g * (num / (1.0 + e)) * u;
    }
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind, Tensor};

    fn rel(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[]) / b.abs().max().double_value(&[]).max(1e-12)
    }

    /// Each op against the libtorch ops it replaces: rotary outputs
    /// and pool copies identical, the norm and SiLU within a few
    /// float32 steps.
    #[test]
    fn cpu_ops_match_libtorch() {
        tch::manual_seed(3);
        let opts = (Kind::Float, Device::Cpu);
        let (n, hidden, eps) = (5, 96, 1e-5);
        let x = Tensor::randn([n, hidden], opts) * 3.0;
        let d = Tensor::randn([n, hidden], opts);
        let w = Tensor::randn([hidden], opts);
        let sum = &x + &d;
        let var = sum.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
        let reference = &w * (&sum * (var + eps).rsqrt());
        let (got_x, got_h) = super::add_rms_norm(&x, Some(&d), &w, eps).expect("norm");
        assert_eq!(got_x, sum);
        assert!(
            rel(&got_h, &reference) < 1e-6,
            "{}",
            rel(&got_h, &reference)
        );
        let (same, alone) = super::add_rms_norm(&sum, None, &w, eps).expect("norm");
        assert_eq!(same, sum);
        assert!(rel(&alone, &reference) < 1e-6);

        let inter = 40;
        let gu = Tensor::randn([3, 2 * inter], opts) * 4.0;
        // Far tails too: exp(-|g|) underflows past |g| = 87.
        gu.narrow(1, 0, 4)
            .copy_(&Tensor::from_slice(&[-100f32, 100.0, -30.0, 0.0]).expand([3, 4], false));
        let reference = gu.narrow(1, 0, inter).silu() * gu.narrow(1, inter, inter);
        let got = super::silu_mul(&gu, inter).expect("silu");
        assert!(rel(&got, &reference) < 1e-6, "{}", rel(&got, &reference));

        let (heads, kvh, hd) = (4i64, 2i64, 8i64);
        let rope = crate::layers::rope::Rope::new(
            10000.0,
            &crate::config::RopeScaling::None,
            hd,
            64,
            Device::Cpu,
        )
        .expect("rope");
        let pos = Tensor::from_slice(&[0i64, 5, 63]);
        let at = rope.at(&pos).expect("at");
        let qkv = Tensor::randn([3, (heads + 2 * kvh) * hd], opts);
        let slots = Tensor::from_slice(&[7i64, 0, 12]);
        let (q, k, v) = at.apply_qkv(&qkv, heads, kvh, hd).expect("rope");
        let rk = Tensor::zeros([16, kvh, hd], opts);
        let rv = Tensor::zeros([16, kvh, hd], opts);
        let _ = rk.shallow_clone().index_copy_(0, &slots, &k);
        let _ = rv.shallow_clone().index_copy_(0, &slots, &v);
        let (gk, gv) = (
            Tensor::zeros([16, kvh, hd], opts),
            Tensor::zeros([16, kvh, hd], opts),
        );
        let (cos, ssin) = at.tables(Kind::Float).expect("tables");
        let got =
            super::rope_kv(&qkv, &cos, &ssin, &slots, &gk, &gv, heads, kvh, hd).expect("rope_kv");
        assert_eq!(got, q.contiguous());
        assert_eq!(gk, rk);
        assert_eq!(gv, rv);
        // A slot outside the pool is an error, not a write.
        let bad = Tensor::from_slice(&[7i64, 0, 16]);
        assert!(super::rope_kv(&qkv, &cos, &ssin, &bad, &gk, &gv, heads, kvh, hd).is_err());
        // A float16 pool: the same keys and values, each rounded as
        // libtorch's conversion rounds them.
        let half = (Kind::Half, Device::Cpu);
        let (hk, hv) = (
            Tensor::zeros([16, kvh, hd], half),
            Tensor::zeros([16, kvh, hd], half),
        );
        let got =
            super::rope_kv(&qkv, &cos, &ssin, &slots, &hk, &hv, heads, kvh, hd).expect("rope_kv");
        assert_eq!(got, q.contiguous());
        assert_eq!(hk, rk.to_kind(Kind::Half));
        assert_eq!(hv, rv.to_kind(Kind::Half));
        assert_ne!(hk.to_kind(Kind::Float), rk, "nothing was rounded");
    }
}
