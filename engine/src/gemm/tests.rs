//! Tests of the packed f32 products against libtorch's and of their
//! kernels' sums.

use super::*;

fn pool() -> Workers {
    Workers::new(2).expect("workers")
}

/// One panel's product over all of k, block by block, with the SIMD
/// kernel (prefetching) or the portable one.
fn whole(x: &[f32], k: usize, rows: usize, w: &[f32], tile: &mut [f32], simd: bool) {
    let mut k0 = 0;
    while k0 < k {
        let k1 = k.min(k0 + KC);
        if simd {
            kernel(x, k, rows, k0, k1, w, tile, 0b11);
        } else {
            portable(x, k, rows, k0, k1, w, tile);
        }
        k0 = k1;
    }
}

/// Matches libtorch's linear for ragged shapes, and each row's result
/// does not depend on the other rows.
#[test]
fn matches_linear_and_is_row_invariant() {
    tch::manual_seed(3);
    let pool = pool();
    for (n, k) in [(70usize, 45usize), (32, 512), (1000, 96)] {
        let w = Tensor::randn([n as i64, k as i64], (Kind::Float, Device::Cpu));
        let p = Packed::new(&w).expect("pack");
        for m in [1i64, 3, 8, 13, 40, 70] {
            let x = Tensor::randn([m, k as i64], (Kind::Float, Device::Cpu));
            let got = p.forward(&x, &pool).expect("forward");
            let want = x.linear::<Tensor>(&w, None);
            let diff = (&got - &want).abs().max().double_value(&[]);
            assert!(diff < 1e-4, "n={n} k={k} m={m}: max diff {diff}");
            let alone = p.forward(&x.narrow(0, m - 1, 1), &pool).expect("row");
            let same = got.narrow(0, m - 1, 1).equal(&alone);
            assert!(same, "n={n} k={k} m={m}: last row differs when alone");
        }
    }
}

/// The SIMD kernel and the portable one sum in the same order, so they
/// agree to the bit (k spans several blocks and a partial one).
#[test]
fn simd_and_portable_kernels_agree_exactly() {
    tch::manual_seed(5);
    let k = 2 * KC + 37;
    let w = Tensor::randn([NR as i64, k as i64], (Kind::Float, Device::Cpu));
    let p = Packed::new(&w).expect("pack");
    let x = Tensor::randn([MR as i64, k as i64], (Kind::Float, Device::Cpu));
    let xs = crate::attn::f32_view(&x).expect("view");
    for rows in 1..=MR {
        let (mut a, mut b) = ([0f32; MR * NR], [0f32; MR * NR]);
        whole(xs, k, rows, &p.data, &mut a, true);
        whole(xs, k, rows, &p.data, &mut b, false);
        assert_eq!(a[..rows * NR], b[..rows * NR], "rows={rows}");
    }
}

/// The AVX2 kernels give the portable kernel's bits on every CPU that
/// has AVX2 and FMA (AVX-512 machines included, whose products take
/// the AVX-512 kernels): a block through each row count of a group
/// (1 to SG rows: register tiles of 1 to 6 rows, several per call),
/// and a one-row product
/// over several panels.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_and_portable_kernels_agree_exactly() {
    assert!(
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma"),
        "this test needs an x86-64 CPU with AVX2 and FMA"
    );
    tch::manual_seed(17);
    let k = 2 * KC + 37;
    let n = PANELS1 * NR;
    let w = Tensor::randn([n as i64, k as i64], (Kind::Float, Device::Cpu));
    let p = Packed::new(&w).expect("pack");
    let x = Tensor::randn([SG as i64, k as i64], (Kind::Float, Device::Cpu));
    let xs = crate::attn::f32_view(&x).expect("view");
    // The tile's k in chunks and a prefetch at a time: the same sums
    // (other tests running meanwhile get the same bits either way).
    for chunks in [false, true] {
        set_tile_chunks(chunks);
        for rows in 1..=SG {
            let (mut a, mut b) = ([0f32; SG * NR], [0f32; SG * NR]);
            let mut k0 = 0;
            while k0 < k {
                let k1 = k.min(k0 + KC);
                #[allow(unsafe_code)]
                // SAFETY: AVX2 and FMA (asserted); x holds SG rows of
                // k, the panel k * NR floats, the tile SG * NR.
                unsafe {
                    avx2::rows(xs, k, rows, k0, k1, &p.data, &mut a, 0b11)
                };
                portable(xs, k, rows, k0, k1, &p.data, &mut b);
                k0 = k1;
            }
            assert_eq!(a[..rows * NR], b[..rows * NR], "rows={rows} {chunks}");
        }
    }
    let mut many = [0f32; PANELS1 * NR];
    #[allow(unsafe_code)]
    // SAFETY: AVX2 and FMA (asserted); x holds k floats and the data
    // PANELS1 panels.
    unsafe {
        avx2::one_row(xs, k, &p.data, PANELS1, &mut many)
    };
    for q in 0..PANELS1 {
        let mut plain = [0f32; NR];
        whole(
            xs,
            k,
            1,
            &p.data[q * k * NR..(q + 1) * k * NR],
            &mut plain,
            false,
        );
        assert_eq!(many[q * NR..(q + 1) * NR], plain, "panel {q}");
    }
}

/// Blocked sums stay closer to exact arithmetic than one chain over all
/// of k: on a long dot product (k = 8192) the error against float64 is
/// below a single chain's (computed here with the same FMAs).
#[test]
fn blocked_sums_are_more_accurate_than_one_chain() {
    tch::manual_seed(7);
    let k = 8192usize;
    let w = Tensor::rand([NR as i64, k as i64], (Kind::Float, Device::Cpu));
    let x = Tensor::rand([1, k as i64], (Kind::Float, Device::Cpu));
    let p = Packed::new(&w).expect("pack");
    let got = p.forward(&x, &pool()).expect("forward");
    let got: Vec<f32> = Vec::try_from(&got.flatten(0, -1)).expect("vec");
    let exact = x
        .to_kind(Kind::Double)
        .linear::<Tensor>(&w.to_kind(Kind::Double), None);
    let exact: Vec<f64> = Vec::try_from(&exact.flatten(0, -1)).expect("vec");
    let (xs, ws) = (
        crate::attn::f32_view(&x).expect("x"),
        crate::attn::f32_view(&w).expect("w"),
    );
    let (mut blocked, mut chain) = (0f64, 0f64);
    for c in 0..NR {
        let one = xs
            .iter()
            .zip(&ws[c * k..(c + 1) * k])
            .fold(0f32, |acc, (&a, &b)| a.mul_add(b, acc));
        chain = chain.max((one as f64 - exact[c]).abs());
        blocked = blocked.max((got[c] as f64 - exact[c]).abs());
    }
    assert!(
        blocked < chain,
        "blocked error {blocked:.3e} is not below one chain's {chain:.3e}"
    );
}

/// A one-row product over several panels at once (2 or 4) gives each
/// element to the bit what the one-panel kernel gives it (SIMD and
/// portable), and a single row through `forward`, in units of either,
/// equals that row in a batch (n spans whole units and a remainder).
#[test]
fn one_row_over_several_panels_agrees_exactly() {
    tch::manual_seed(11);
    let k = 2 * KC + 37;
    let n = (2 * PANELS1 + 3) * NR - 5;
    let w = Tensor::randn([n as i64, k as i64], (Kind::Float, Device::Cpu));
    let p = Packed::new(&w).expect("pack");
    let x = Tensor::randn([3, k as i64], (Kind::Float, Device::Cpu));
    let xs = crate::attn::f32_view(&x).expect("view");
    for panels in [2, PANELS1] {
        let mut many = [f32::NAN; PANELS1 * NR];
        kernel_one_row(xs, k, &p.data[..panels * k * NR], panels, &mut many);
        for q in 0..panels {
            let (mut simd, mut plain) = ([0f32; MR * NR], [0f32; MR * NR]);
            let panel = &p.data[q * k * NR..(q + 1) * k * NR];
            whole(xs, k, 1, panel, &mut simd, true);
            whole(xs, k, 1, panel, &mut plain, false);
            assert_eq!(
                many[q * NR..(q + 1) * NR],
                simd[..NR],
                "{panels}: panel {q}"
            );
            assert_eq!(simd[..NR], plain[..NR], "panel {q}");
        }
    }
    let pool = pool();
    let batch = p.forward(&x, &pool).expect("batch");
    // Units change which thread computes a column, never its sum
    // (other tests running meanwhile get the same bits either way).
    for unit in [2, PANELS1, 0] {
        set_one_row_panels(unit);
        for r in 0..3 {
            let alone = p.forward(&x.narrow(0, r, 1), &pool).expect("row");
            assert!(
                batch.narrow(0, r, 1).equal(&alone),
                "unit {unit}: row {r} differs alone"
            );
        }
    }
}

/// The gated product equals the plain product then the SiLU pass, to
/// the bit, for every row count's path (one row: whole groups of
/// panels and a remainder) and an intermediate width that ends in a
/// partial panel; without the SiLU it is the plain product.
#[test]
fn gated_silu_equals_product_then_silu() {
    tch::manual_seed(13);
    let pool = pool();
    for (inter, k) in [(5 * NR + 7, 2 * KC + 37), (3 * NR, 96)] {
        let w = Tensor::randn([2 * inter as i64, k as i64], (Kind::Float, Device::Cpu));
        let plain = Packed::new(&w).expect("pack");
        let gated = Packed::gated(&w).expect("pack gated");
        for m in [1i64, 3, 13, 40] {
            let x = Tensor::randn([m, k as i64], (Kind::Float, Device::Cpu));
            let gu = plain.forward(&x, &pool).expect("forward");
            let want = crate::fused::silu_mul(&gu, inter as i64)
                .expect("silu")
                .expect("cpu silu");
            let got = gated.forward_silu(&x, &pool).expect("gated");
            assert!(got.equal(&want), "inter={inter} k={k} m={m}");
        }
        for m in [1i64, 2, 13] {
            let x = Tensor::randn([m, k as i64], (Kind::Float, Device::Cpu));
            let both = gated.forward(&x, &pool).expect("gated plain");
            assert!(both.equal(&plain.forward(&x, &pool).expect("plain")));
        }
        // One row in units of one gate/up pair and of two.
        let x = Tensor::randn([1, k as i64], (Kind::Float, Device::Cpu));
        let gu = plain.forward(&x, &pool).expect("forward");
        let want = crate::fused::silu_mul(&gu, inter as i64)
            .expect("silu")
            .expect("cpu silu");
        for unit in [2, PANELS1, 0] {
            set_one_row_panels(unit);
            let got = gated.forward_silu(&x, &pool).expect("gated");
            assert!(got.equal(&want), "inter={inter} unit={unit}");
        }
        let x = Tensor::randn([2, k as i64], (Kind::Float, Device::Cpu));
        assert!(plain.forward_silu(&x, &pool).is_err());
    }
    let odd = Tensor::zeros([7, 8], (Kind::Float, Device::Cpu));
    assert!(Packed::gated(&odd).is_err());
}

#[test]
fn rejects_a_mismatched_input() {
    let w = Tensor::zeros([4, 8], (Kind::Float, Device::Cpu));
    let p = Packed::new(&w).expect("pack");
    let x = Tensor::zeros([2, 7], (Kind::Float, Device::Cpu));
    assert!(p.forward(&x, &pool()).is_err());
}
