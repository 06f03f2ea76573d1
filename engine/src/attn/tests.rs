use super::*;

/// A float32 CPU tensor of standard normal values.
fn randn(shape: [i64; 3]) -> Tensor {
    Tensor::randn(shape, (Kind::Float, Device::Cpu))
}

/// `nh` query heads over `nkv` KV heads of `hd`, scaled by `scale`, no
/// soft cap.
fn heads(nh: i64, nkv: i64, hd: i64, scale: f32) -> Heads {
    Heads {
        heads: nh as usize,
        kv_heads: nkv as usize,
        head_dim: hd as usize,
        scale,
        softcap: None,
    }
}

/// One decode sequence per block table, on rows 0, 1, ...
fn seqs_of(tables: &[Vec<i64>]) -> Vec<DecodeSeq<'_>> {
    tables
        .iter()
        .enumerate()
        .map(|(row, s)| DecodeSeq { row, slots: s })
        .collect()
}

/// The largest absolute difference between two outputs.
/// Room for a sequence's softmax statistics (two floats a query head).
fn stats(h: Heads) -> Vec<f32> {
    vec![0.0; 2 * h.heads]
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// The exponent bits `exp` forms from n: 2^n for every n it can meet.
#[test]
fn exp_scales_by_powers_of_two() {
    for n in -126..=0i32 {
        assert_eq!(pow2(n as f32), 2f32.powi(n), "n = {n}");
    }
    // The clamp keeps n inside that range.
    assert_eq!((-87.0f32 * std::f32::consts::LOG2_E).round(), -126.0);
    assert!(exp(-1e9) > 0.0 && exp(f32::NEG_INFINITY) > 0.0);
    assert_eq!(exp(0.0), 1.0);
}

/// The softmax exponential against the standard library's.
#[test]
fn exp_is_accurate() {
    let mut worst = 0f32;
    let mut x = -90.0f32;
    while x <= 0.0 {
        let (got, want) = (exp(x), x.exp());
        let rel = if want > 1e-30 {
            ((got - want) / want).abs()
        } else {
            got.abs()
        };
        worst = worst.max(rel);
        x += 0.001;
    }
    assert!(worst < 4e-7, "worst relative error {worst}");
}

/// With a scale and a logit soft cap, the kernel agrees with the same
/// attention written in libtorch ops (transformers' eager order:
/// scale, cap, softmax), and the cap changes the result.
#[test]
fn soft_capped_scores_match_eager_attention() {
    tch::manual_seed(11);
    let (nh, nkv, hd, slots) = (4i64, 2i64, 16i64, 40i64);
    let k = randn([slots, nkv, hd]) * 3.0;
    let v = randn([slots, nkv, hd]);
    let q = randn([1, nh, hd]) * 3.0;
    let table: Vec<i64> = (0..slots).rev().collect();
    let seqs = [DecodeSeq {
        row: 0,
        slots: &table,
    }];
    let (scale, cap) = (0.125f32, 5.0f32);
    let capped = |softcap| Heads {
        softcap,
        ..heads(nh, nkv, hd, scale)
    };
    let (qs, ks, vs) = (
        f32_view(&q).expect("q"),
        f32_view(&k).expect("k"),
        f32_view(&v).expect("v"),
    );
    let got = decode(qs, ks, vs, &seqs, capped(Some(cap)), None);
    let uncapped = decode(qs, ks, vs, &seqs, capped(None), None);
    let idx = Tensor::from_slice(&table);
    let kk = k
        .index_select(0, &idx)
        .transpose(0, 1)
        .repeat_interleave_self_int(nh / nkv, 0, None);
    let vv = v
        .index_select(0, &idx)
        .transpose(0, 1)
        .repeat_interleave_self_int(nh / nkv, 0, None);
    let w = q.transpose(0, 1).matmul(&kk.transpose(1, 2)) * (scale as f64);
    let w = ((w / (cap as f64)).tanh() * (cap as f64)).softmax(-1, Kind::Float);
    let want = w.matmul(&vv).transpose(0, 1).contiguous();
    let want = f32_view(&want).expect("want").to_vec();
    let diff = max_diff(&got, &want);
    assert!(diff < 1e-5, "max diff {diff}");
    assert!(max_diff(&uncapped, &want) > 1e-3, "the cap changed nothing");
}

/// The AVX2 kernel against the portable body, for head dims of one
/// vector to many (and pieces of the value sums: 24 is 16 + 8), over
/// float32 and float16 caches: the same attention to float32 rounding
/// (the sums are added in another order).
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_kernel_matches_the_portable_body() {
    if !*HAS_AVX2_FMA {
        eprintln!("no AVX2, FMA and F16C on this CPU: nothing to compare");
        return;
    }
    // SAFETY (both): the CPU has AVX2, FMA and F16C (checked above).
    #[allow(unsafe_code)]
    kernel_matches_the_portable_body(
        &[8, 24, 64, 128, 256],
        |q, k, v, s, h, o, st| unsafe { avx2::one_seq(q, k, v, s, h, 0..h.kv_heads, o, st) },
        |q, k, v, s, h, o, st| unsafe { avx2::one_seq(q, k, v, s, h, 0..h.kv_heads, o, st) },
    );
}

/// The AVX-512 kernel against the portable body, for each head dim it
/// takes, as the AVX2 one above: 300 keys are 18 runs of 16 and 12 alone,
/// and groups of 3, 4 and 5 query heads take runs of 3, 4 and 3 + 2.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_kernel_matches_the_portable_body() {
    if !*HAS_AVX512 {
        eprintln!("no AVX-512F on this CPU: nothing to compare");
        return;
    }
    // SAFETY (both): the CPU has AVX-512F (checked above).
    #[allow(unsafe_code)]
    kernel_matches_the_portable_body(
        &[16, 32, 64, 128, 256],
        |q, k, v, s, h, o, st| unsafe { avx512::one_seq(q, k, v, s, h, 0..h.kv_heads, o, st) },
        |q, k, v, s, h, o, st| unsafe { avx512::one_seq(q, k, v, s, h, 0..h.kv_heads, o, st) },
    );
}

/// A kernel's result (`f32k` on a float32 cache, `f16k` on a float16 one)
/// and softmax statistics (each head's maximum and sum) against the
/// portable body's, within float32 rounding, for groups of 3, 4 and 5
/// query heads a KV head at each head dim in `hds`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::type_complexity)]
fn kernel_matches_the_portable_body(
    hds: &[i64],
    f32k: impl Fn(&[f32], &[f32], &[f32], &DecodeSeq<'_>, Heads, &mut [f32], &mut [f32]) -> bool,
    f16k: impl Fn(
        &[f32],
        &[half::f16],
        &[half::f16],
        &DecodeSeq<'_>,
        Heads,
        &mut [f32],
        &mut [f32],
    ) -> bool,
) {
    tch::manual_seed(17);
    for (hd, nh) in hds.iter().flat_map(|&hd| [6i64, 8, 10].map(|nh| (hd, nh))) {
        let (nkv, slots) = (2i64, 300i64);
        let k = randn([slots, nkv, hd]) * 2.0;
        let v = randn([slots, nkv, hd]);
        let q = randn([2, nh, hd]);
        let table: Vec<i64> = (0..slots).map(|j| (j * 7) % slots).collect();
        let s = DecodeSeq {
            row: 1,
            slots: &table,
        };
        let h = heads(nh, nkv, hd, (hd as f32).powf(-0.5));
        let qs = f32_view(&q).expect("q");
        let n = (nh * hd) as usize;
        let check = |got: &[f32], want: &[f32], what: &str| {
            let worst = max_diff(got, want);
            assert!(
                worst < 1e-5,
                "head dim {hd}, {nh} heads, {what}: differs by {worst}"
            );
        };
        // Maxima and sums, relative to their size.
        let check_stats = |got: &[f32], want: &[f32], what: &str| {
            for (g, w) in got.iter().zip(want) {
                assert!(
                    (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "head dim {hd}, {nh} heads, {what}: statistics {got:?} against {want:?}"
                );
            }
        };
        let (ks, vs) = (f32_view(&k).expect("k"), f32_view(&v).expect("v"));
        let (mut got, mut want) = (vec![0f32; n], vec![0f32; n]);
        let (mut got_st, mut want_st) = (stats(h), stats(h));
        assert!(
            f32k(qs, ks, vs, &s, h, &mut got, &mut got_st),
            "head dim {hd} not taken"
        );
        one_seq_body(qs, ks, vs, &s, h, 0..h.kv_heads, &mut want, &mut want_st);
        check(&got, &want, "float32 cache");
        check_stats(&got_st, &want_st, "float32 cache");
        let (k16, v16) = (k.to_kind(Kind::Half), v.to_kind(Kind::Half));
        let (ks, vs) = (
            kv_view::<half::f16>(&k16).expect("k"),
            kv_view::<half::f16>(&v16).expect("v"),
        );
        assert!(
            f16k(qs, ks, vs, &s, h, &mut got, &mut got_st),
            "head dim {hd} not taken"
        );
        one_seq_body(qs, ks, vs, &s, h, 0..h.kv_heads, &mut want, &mut want_st);
        check(&got, &want, "float16 cache");
        check_stats(&got_st, &want_st, "float16 cache");
    }
}

/// Split over the workers (enough keys to split), every sequence's
/// result is the one it gets alone on the calling thread, bit for bit:
/// by sequences, and (one or two sequences) by runs of KV heads and
/// chunks of keys (sequences of 40 to 940 keys: one to four chunks).
#[test]
fn split_over_workers_changes_nothing() {
    tch::manual_seed(5);
    let (nh, nkv, hd, slots) = (8i64, 4i64, 64i64, 1024i64);
    let k = randn([slots, nkv, hd]);
    let v = randn([slots, nkv, hd]);
    let q = randn([7, nh, hd]);
    let tables: Vec<Vec<i64>> = (0..7)
        .map(|i| (0..(40 + 150 * i)).map(|j| (j * 7 + i) % slots).collect())
        .collect();
    let seqs = seqs_of(&tables);
    let h = heads(nh, nkv, hd, 0.125);
    let (qs, ks, vs) = (
        f32_view(&q).expect("q"),
        f32_view(&k).expect("k"),
        f32_view(&v).expect("v"),
    );
    for n in [1, 2, 7] {
        let seqs = &seqs[7 - n..];
        let alone = decode(qs, ks, vs, seqs, h, None);
        for threads in [2, 3] {
            let workers = crate::workers::Workers::new(threads).expect("workers");
            assert_eq!(decode(qs, ks, vs, seqs, h, Some(&workers)), alone);
        }
    }
}

/// The kernel agrees with libtorch's SDPA on the gathered keys.
#[test]
fn matches_sdpa() {
    tch::manual_seed(7);
    let (nh, nkv, hd, slots) = (8i64, 2i64, 64i64, 64i64);
    let k = randn([slots, nkv, hd]);
    let v = randn([slots, nkv, hd]);
    let q = randn([3, nh, hd]);
    let tables: Vec<Vec<i64>> = vec![
        (0..17).map(|i| (i * 3) % slots).collect(),
        vec![5],
        (10..60).collect(),
    ];
    let seqs = seqs_of(&tables);
    let h = heads(nh, nkv, hd, 1.0 / (hd as f32).sqrt());
    let qs = f32_view(&q).expect("q");
    let ks = f32_view(&k).expect("k");
    let vs = f32_view(&v).expect("v");
    let workers = crate::workers::Workers::new(2).expect("workers");
    for pool in [None, Some(&workers)] {
        let got = decode(qs, ks, vs, &seqs, h, pool);
        for (i, t) in tables.iter().enumerate() {
            let idx = Tensor::from_slice(t);
            let kk = k.index_select(0, &idx).transpose(0, 1).unsqueeze(0);
            let vv = v.index_select(0, &idx).transpose(0, 1).unsqueeze(0);
            let qq = q.narrow(0, i as i64, 1).transpose(0, 1).unsqueeze(0);
            let want = Tensor::scaled_dot_product_attention::<Tensor>(
                &qq, &kk, &vv, None, 0.0, false, None, true,
            )
            .squeeze_dim(0)
            .transpose(0, 1)
            .contiguous();
            let want = f32_view(&want).expect("want").to_vec();
            let per = (nh * hd) as usize;
            let g = &got[i * per..(i + 1) * per];
            let diff = max_diff(g, &want);
            assert!(
                diff < 1e-5,
                "seq {i} pool {}: max diff {diff}",
                pool.is_some()
            );
        }
    }
}

/// Sequences longer than a chunk of keys ([`CHUNK`]), whose chunks'
/// results are merged, agree with libtorch's SDPA on the gathered keys:
/// one alone (its chunks shared out over the threads, and on the calling
/// thread), with two others, and with one KV head (whose single
/// sequence's chunks are the only work to share).
#[test]
fn long_sequences_match_sdpa() {
    tch::manual_seed(11);
    for nkv in [3i64, 1] {
        let (nh, hd, slots) = (9i64, 64i64, 2048i64);
        let k = randn([slots, nkv, hd]);
        let v = randn([slots, nkv, hd]);
        let q = randn([3, nh, hd]) * 2.0;
        let tables: Vec<Vec<i64>> = [1500i64, 257, 700]
            .iter()
            .enumerate()
            .map(|(i, &len)| (0..len).map(|j| (j * 5 + 3 * i as i64) % slots).collect())
            .collect();
        let h = heads(nh, nkv, hd, 1.0 / (hd as f32).sqrt());
        let (qs, ks, vs) = (
            f32_view(&q).expect("q"),
            f32_view(&k).expect("k"),
            f32_view(&v).expect("v"),
        );
        let workers = crate::workers::Workers::new(2).expect("workers");
        for n in [1, 3] {
            let seqs = seqs_of(&tables[..n]);
            for pool in [None, Some(&workers)] {
                let got = decode(qs, ks, vs, &seqs, h, pool);
                for (i, t) in tables[..n].iter().enumerate() {
                    let idx = Tensor::from_slice(t);
                    let kk = k.index_select(0, &idx).transpose(0, 1).unsqueeze(0);
                    let vv = v.index_select(0, &idx).transpose(0, 1).unsqueeze(0);
                    let qq = q.narrow(0, i as i64, 1).transpose(0, 1).unsqueeze(0);
                    let want = Tensor::scaled_dot_product_attention::<Tensor>(
                        &qq, &kk, &vv, None, 0.0, false, None, true,
                    )
                    .squeeze_dim(0)
                    .transpose(0, 1)
                    .contiguous();
                    let want = f32_view(&want).expect("want").to_vec();
                    let per = (nh * hd) as usize;
                    let diff = max_diff(&got[i * per..(i + 1) * per], &want);
                    assert!(
                        diff < 1e-5,
                        "{nkv} KV heads, {n} seqs, seq {i} ({} keys), pool {}: max diff {diff}",
                        t.len(),
                        pool.is_some()
                    );
                }
            }
        }
    }
}

/// Both ways of one sequence (the AVX-512 kernel where the CPU and head
/// dim allow, and the portable body) agree with libtorch's SDPA on the
/// gathered keys, for every head dim the AVX-512 kernel takes and one
/// it does not, odd and even numbers of keys; with a float32 pool, and
/// with a float16 one (against SDPA on its values widened to float32).
#[test]
fn both_paths_match_sdpa_for_every_head_dim() {
    both_paths_match_sdpa::<f32>();
    both_paths_match_sdpa::<half::f16>();
}

fn both_paths_match_sdpa<T: KvElem>() {
    tch::manual_seed(13);
    for hd in [16i64, 32, 64, 80, 128, 256] {
        let (nh, nkv, slots) = (6i64, 2i64, 300i64);
        let k = randn([slots, nkv, hd]).to_kind(T::KIND);
        let v = randn([slots, nkv, hd]).to_kind(T::KIND);
        let q = randn([1, nh, hd]) * 2.0;
        let h = heads(nh, nkv, hd, 1.0 / (hd as f32).sqrt());
        for len in [1usize, 2, 7, 64, 299] {
            let table: Vec<i64> = (0..len as i64).map(|j| (j * 37 + 5) % slots).collect();
            let s = DecodeSeq {
                row: 0,
                slots: &table,
            };
            let idx = Tensor::from_slice(&table);
            let gather = |t: &Tensor| {
                t.index_select(0, &idx)
                    .to_kind(Kind::Float)
                    .transpose(0, 1)
                    .unsqueeze(0)
            };
            let (kk, vv) = (gather(&k), gather(&v));
            let qq = q.transpose(0, 1).unsqueeze(0);
            let want = Tensor::scaled_dot_product_attention::<Tensor>(
                &qq, &kk, &vv, None, 0.0, false, None, true,
            )
            .squeeze_dim(0)
            .transpose(0, 1)
            .contiguous();
            let want = f32_view(&want).expect("want").to_vec();
            let (qs, ks, vs) = (
                f32_view(&q).expect("q"),
                kv_view::<T>(&k).expect("k"),
                kv_view::<T>(&v).expect("v"),
            );
            let mut fast = vec![0f32; (nh * hd) as usize];
            let mut portable = fast.clone();
            one_seq(qs, ks, vs, &s, h, 0..h.kv_heads, &mut fast, &mut stats(h));
            one_seq_portable(
                qs,
                ks,
                vs,
                &s,
                h,
                0..h.kv_heads,
                &mut portable,
                &mut stats(h),
            );
            for (name, got) in [("dispatched", &fast), ("portable", &portable)] {
                let diff = max_diff(got, &want);
                assert!(
                    diff < 2e-5,
                    "{:?} pool, hd {hd}, {len} keys, {name}: max diff {diff}",
                    T::KIND
                );
            }
        }
    }
}
