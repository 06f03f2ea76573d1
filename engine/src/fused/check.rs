//! Each kernel beside the libtorch ops it replaces, and the matrix-vector
//! kernel's speed beside cuBLAS: for `cuda_check` on a GPU machine.

use tch::{Kind, Tensor};

use super::*;

/// Runs each kernel on seeded random bf16 tensors on CUDA beside the
/// libtorch ops it replaces (transformers' arithmetic) and returns, per
/// output, the largest difference: `(name, max |a - b| / max |b|)`. The
/// residual sum, SiLU x up and the rotary outputs should be identical (0);
/// the norm may differ by a bf16 step where its float32 sum of squares is
/// added in another order. For `cuda_check` on a GPU machine.
pub fn check_against_libtorch() -> Result<Vec<(String, f64)>, EngineError> {
    use tch::Device;
    let dev = Device::Cuda(0);
    let opts = (Kind::BFloat16, dev);
    prepare();
    if !READY.load(Ordering::Relaxed) {
        return Err(EngineError::Step("fused kernels not loaded".into()));
    }
    let rel = |a: &Tensor, b: &Tensor| -> f64 {
        let (a, b) = (a.to_kind(Kind::Float), b.to_kind(Kind::Float));
        (&a - &b).abs().max().double_value(&[]) / b.abs().max().double_value(&[]).max(1e-12)
    };
    tch::manual_seed(7);
    let mut out = Vec::new();
    // SiLU(gate) x up.
    let inter = 1000;
    let gu = (Tensor::f_randn([7, 2 * inter], opts)? * 3.0).f_contiguous()?;
    let reference = gu
        .f_narrow(1, 0, inter)?
        .f_silu()?
        .f_mul(&gu.f_narrow(1, inter, inter)?)?;
    out.push((
        "silu_mul".into(),
        rel(&cuda_silu_mul(&gu, inter)?, &reference),
    ));
    // Residual add + RMSNorm, against LlamaRMSNorm's ops.
    let hidden = 2048;
    let x = Tensor::f_randn([5, hidden], opts)? * 4.0;
    let d = Tensor::f_randn([5, hidden], opts)?;
    let w = Tensor::f_randn([hidden], opts)?;
    let eps = 1e-5;
    let sum = x.f_add(&d)?;
    let f = sum.f_to_kind(Kind::Float)?;
    let var = f
        .f_pow_tensor_scalar(2)?
        .f_mean_dim(-1, true, Kind::Float)?;
    let normed = f
        .f_mul(&var.f_add_scalar(eps)?.f_rsqrt()?)?
        .f_to_kind(Kind::BFloat16)?;
    let reference = w.f_mul(&normed)?;
    let (got_x, got_h) = cuda_add_rms_norm(&x, Some(&d), &w, eps)?;
    out.push(("residual add".into(), rel(&got_x, &sum)));
    out.push(("rms_norm (after add)".into(), rel(&got_h, &reference)));
    let (_, alone) = cuda_add_rms_norm(&sum, None, &w, eps)?;
    out.push(("rms_norm (alone)".into(), rel(&alone, &reference)));
    // Rotary embedding + KV write, against the rope ops and index_copy_.
    let (heads, kv_heads, hd, n) = (8, 2, 64, 6);
    let rope =
        crate::layers::rope::Rope::new(10000.0, &crate::config::RopeScaling::None, hd, 4096, dev)?;
    let pos = Tensor::from_slice(&[0i64, 1, 17, 250, 1000, 4095]).f_to_device(dev)?;
    let at = rope.at(&pos)?;
    let qkv = Tensor::f_randn([n, (heads + 2 * kv_heads) * hd], opts)? * 2.0;
    let slots = Tensor::from_slice(&[3i64, 9, 0, 31, 12, 20]).f_to_device(dev)?;
    let (q, k, v) = at.apply_qkv(&qkv, heads, kv_heads, hd)?;
    let (rk, rv) = (
        Tensor::f_zeros([32, kv_heads, hd], opts)?,
        Tensor::f_zeros([32, kv_heads, hd], opts)?,
    );
    let _ = rk.shallow_clone().f_index_copy_(0, &slots, &k)?;
    let _ = rv.shallow_clone().f_index_copy_(0, &slots, &v)?;
    let (gk, gv) = (
        Tensor::f_zeros([32, kv_heads, hd], opts)?,
        Tensor::f_zeros([32, kv_heads, hd], opts)?,
    );
    let (cos, ssin) = at.tables(Kind::BFloat16)?;
    let gq = cuda_rope_kv(&qkv, &cos, &ssin, &slots, &gk, &gv, heads, kv_heads, hd)?;
    out.push(("rope queries".into(), rel(&gq, &q)));
    out.push(("rope keys in the pool".into(), rel(&gk, &rk)));
    out.push(("values in the pool".into(), rel(&gv, &rv)));
    // The matrix-vector kernel against cuBLAS (F.linear): float32 sums in
    // another order, so a result may round one bf16 step apart.
    for (m, n, k, with_bias) in [
        (1, 1000, 4096, false),
        (1, 1001, 14336, true),
        (3, 777, 2048, true),
        (8, 512, 14336, false),
    ] {
        let x = Tensor::f_randn([m, k], opts)?;
        let w = Tensor::f_randn([n, k], opts)? * 0.05;
        let b = Tensor::f_randn([n], opts)?;
        let bias = with_bias.then_some(&b);
        let reference = x.f_linear(&w, bias)?;
        let got = Tensor::f_empty([m, n], opts)?;
        ffi::gemv(&x, &w, bias, &got)?;
        out.push((format!("gemv {m}x{k} . {n}x{k}"), rel(&got, &reference)));
    }
    // Gate/up and SiLU in one kernel against the matrix-vector kernel then
    // the SiLU kernel: the same bits when its rows are split as gemv's are
    // (2 or 4 warps a row, the default 4), or at one warp a row with four
    // loads a lane (GYRE_GEMV_SPLIT=1 without GYRE_GEMV_UNROLL); at 8 warps
    // a row the SiLU kernel takes one warp a row, another order of sums: a
    // bf16 step apart at most, named as the gemv rows are.
    let unroll4 = std::env::var("GYRE_GEMV_UNROLL").map_or(true, |v| v != "8" && v != "16");
    let default_order = match std::env::var("GYRE_GEMV_SPLIT").as_deref() {
        Ok("1") => unroll4,
        Ok("8") => false,
        _ => true,
    };
    let label = if default_order {
        "silu gemv"
    } else {
        "gemv + silu (another gemv order)"
    };
    for (inter, k) in [(1000i64, 4096i64), (1001, 2048)] {
        let x = Tensor::f_randn([1, k], opts)?;
        let w = Tensor::f_randn([2 * inter, k], opts)? * 0.05;
        let gu = Tensor::f_empty([1, 2 * inter], opts)?;
        ffi::gemv(&x, &w, None, &gu)?;
        let reference = cuda_silu_mul(&gu, inter)?;
        let got = Tensor::f_empty([1, inter], opts)?;
        ffi::gemv_silu(&x, &w, &got)?;
        out.push((
            format!(
                "{label} 1x{k} . {}x{k} (one kernel vs gemv then silu_mul)",
                2 * inter
            ),
            rel(&got, &reference),
        ));
    }
    // Decode attention over the pool in place against flash attention over
    // the gathered keys: float32 sums in another order.
    for (heads, kv_heads, hd) in [(32i64, 8i64, 128i64), (9, 3, 64)] {
        let slots = 4096;
        let kc = Tensor::f_randn([slots, kv_heads, hd], opts)?;
        let vc = Tensor::f_randn([slots, kv_heads, hd], opts)?;
        let lens = [1i64, 77, 700, 2500];
        let q = Tensor::f_randn([lens.len() as i64, heads, hd], opts)? * 2.0;
        let perm = Tensor::f_randperm(slots, (Kind::Int64, dev))?;
        let mut gathers = Vec::new();
        let mut at = 0;
        for &l in &lens {
            gathers.push(perm.f_narrow(0, at, l)?);
            at = (at + 131) % (slots - 2600);
        }
        let gather = Tensor::f_cat(&gathers, 0)?;
        let spans: Vec<(i64, i64)> = lens.iter().map(|&l| (1, l)).collect();
        let varlen = crate::flash::Varlen::new(&spans, dev)?;
        let reference = varlen.attend(
            &q,
            &kc.f_index_select(0, &gather)?,
            &vc.f_index_select(0, &gather)?,
        )?;
        let max_k = *lens.iter().max().unwrap_or(&1);
        let got = decode_attention(&q, &kc, &vc, &gather, varlen.cu_k(), None, max_k)?
            .ok_or_else(|| EngineError::Step("decode attention declined".into()))?;
        out.push((
            format!("decode attention {heads}/{kv_heads} heads x {hd}"),
            rel(&got, &reference),
        ));
        // Fixed stride, as a decode graph packs keys: each sequence uses
        // the first `used` of its `stride` rows.
        let stride = 4096i64;
        let mut packed = Vec::new();
        for g in &gathers {
            let pad = Tensor::f_zeros([stride - g.size()[0]], (Kind::Int64, dev))?;
            packed.push(Tensor::f_cat(&[g.shallow_clone(), pad], 0)?);
        }
        let packed = Tensor::f_cat(&packed, 0)?;
        let used: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
        let used = Tensor::from_slice(&used).f_to_device(dev)?;
        let fixed = crate::flash::Varlen::fixed_stride(lens.len() as i64, stride, used)?;
        let got = decode_attention(
            &q,
            &kc,
            &vc,
            &packed,
            fixed.cu_k(),
            fixed.seqused_k(),
            stride,
        )?
        .ok_or_else(|| EngineError::Step("decode attention declined".into()))?;
        out.push((
            format!("decode attention {heads}/{kv_heads} heads x {hd}, fixed stride"),
            rel(&got, &reference),
        ));
    }
    Ok(out)
}

/// Device time of the matrix-vector kernel against cuBLAS (`F.linear`)
/// on the Llama-3-8B shape's projections at batch 1: `(name, weight MB,
/// cuBLAS us, gyre us)`, each the mean of back-to-back calls cycling
/// through copies of the weight larger than the L2 cache together. For
/// `cuda_check` on a GPU machine (eager calls: the smallest products are
/// partly bound by the host's launches).
pub fn time_gemv() -> Result<Vec<(String, f64, f64, f64)>, EngineError> {
    use tch::Device;
    let dev = Device::Cuda(0);
    let opts = (Kind::BFloat16, dev);
    prepare();
    let mut out = Vec::new();
    for (name, n, k) in [
        ("q/k/v", 6144i64, 4096i64),
        ("o", 4096, 4096),
        ("gate/up", 28672, 4096),
        ("down", 4096, 14336),
        ("vocabulary", 128256, 4096),
    ] {
        let mb = (n * k * 2) as f64 / 1e6;
        let copies = ((200.0 / mb).ceil() as usize).max(2);
        let ws: Vec<Tensor> = (0..copies)
            .map(|_| Tensor::f_randn([n, k], opts))
            .collect::<Result<_, _>>()?;
        let x = Tensor::f_randn([1, k], opts)?;
        let iters = 60;
        let time = |f: &dyn Fn(&Tensor) -> Result<Tensor, EngineError>| {
            let run = || -> Result<f64, EngineError> {
                tch::Cuda::synchronize(0);
                let t = std::time::Instant::now();
                for i in 0..iters {
                    drop(f(&ws[i % copies])?);
                }
                tch::Cuda::synchronize(0);
                Ok(t.elapsed().as_secs_f64() * 1e6 / iters as f64)
            };
            run()?;
            run()
        };
        let cublas = time(&|w| Ok(x.f_linear::<Tensor>(w, None)?))?;
        let gyre = time(&|w| {
            let y = Tensor::f_empty([1, n], opts)?;
            ffi::gemv(&x, w, None, &y)?;
            Ok(y)
        })?;
        out.push((name.to_string(), mb, cublas, gyre));
    }
    Ok(out)
}
