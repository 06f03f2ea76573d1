//! The quantized kernels against the dequantized f32 matmul (`dequant.rs`
//! is bit-exact with the `gguf` package, so it is the reference), batch
//! invariance, and SIMD against portable.

use tch::{Device, Kind, Tensor};

use super::*;

fn pool() -> crate::gemm::Workers {
    crate::gemm::Workers::new(2).expect("workers")
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }

    /// An f16 in [2^-7, 2^-5) (as a weight scale), negated when `neg`.
    fn half(&mut self, neg: bool) -> [u8; 2] {
        let bits = 0x2000 + (self.next() >> 53) as u16 % 0x0800;
        (bits | if neg { 0x8000 } else { 0 }).to_le_bytes()
    }
}

const FORMATS: [Format; 5] = [
    Format::Q8_0,
    Format::Q4_0,
    Format::Q4_1,
    Format::Q4K,
    Format::Q6K,
];

/// `k` rounded up to what `fmt`'s blocks allow (Q4_K's super-blocks hold
/// 256 values).
fn fit(fmt: Format, k: usize) -> usize {
    k.next_multiple_of(fmt.ggml().block().0)
}

/// Random ggml blocks of `kind` for `n` rows of `k` values, as a GGUF
/// file holds them: scales, (Q4_1) negative mins or (Q4_K) positive min
/// scales, then random bytes (quants, and the K-quants' packed sub-block
/// scales); Q6_K's f16 scale comes last.
fn random_ggml_of(kind: crate::gguf::GgmlType, n: usize, k: usize, seed: u64) -> Vec<u8> {
    use crate::gguf::GgmlType;
    let mut rng = Rng(seed | 1);
    let (per, bytes) = kind.block();
    let mut data = Vec::new();
    for _ in 0..n * k / per {
        let mut head = rng.half(false).to_vec();
        match kind {
            GgmlType::Q4_1 => head.extend(rng.half(true)),
            GgmlType::Q4K => head.extend(rng.half(false)),
            _ => {}
        }
        let rest: Vec<u8> = (0..bytes - head.len()).map(|_| rng.byte()).collect();
        if kind == GgmlType::Q6K {
            data.extend(rest);
            data.extend(head);
        } else {
            data.extend(head);
            data.extend(rest);
        }
    }
    data
}

fn random_ggml(fmt: Format, n: usize, k: usize, seed: u64) -> Vec<u8> {
    random_ggml_of(fmt.ggml(), n, k, seed)
}

/// Random rows of `fmt`, as the loader makes them from a GGUF's blocks.
fn random_rows(fmt: Format, n: usize, k: usize, seed: u64) -> QuantRows {
    QuantRows::from_ggml(fmt.ggml(), n, k, &random_ggml(fmt, n, k, seed)).expect("rows")
}

/// The kernels this CPU runs (the portable one always).
fn kernels() -> Vec<Kernel> {
    [Kernel::Avx512Vnni, Kernel::Avx2, Kernel::Portable]
        .into_iter()
        .filter(|k| k.runs_here())
        .collect()
}

fn run(w: &QuantMatrix, x: &Tensor, acts: Activations, kernel: Kernel) -> Vec<f32> {
    let m = x.size()[0] as usize;
    let xs = crate::attn::f32_view(x).expect("view");
    let mut out = vec![0f32; m * w.n()];
    w.matmul(xs, m, acts, kernel, &pool(), &mut out);
    out
}

const ACTIVATIONS: [Activations; 3] = [
    Activations::Int8,
    Activations::Int8Residual,
    Activations::F32,
];

/// Each output against `x W^T` in float64 over the dequantized weight, within
/// the error the activations' rounding allows: with int8, a value of block b
/// moves by at most `dx/2 = max|x_b| / 254`, so an output moves by at most
/// `sum_b max|x_b| / 254 * sum_{k in b} |w_k|` (x1.001 for the rounding of
/// `1/dx`); with the int8 residual, by `dx/256` (`max|x_b| / 32512`, x1.01);
/// plus float32 rounding (`1e-5 * sum |w_k x_k|`). The f32 kernel is held
/// to the rounding term alone.
#[test]
fn matches_the_dequantized_matmul_within_the_activation_rounding() {
    tch::manual_seed(11);
    for fmt in FORMATS {
        for (n, k) in [(40usize, 64usize), (64, 576), (17, 1536)] {
            let k = fit(fmt, k);
            let rows = random_rows(fmt, n, k, 7 + n as u64);
            let w = QuantMatrix::new(&rows);
            let wd = rows.dequantize().expect("dequantize");
            let x = Tensor::randn([5, k as i64], (Kind::Float, Device::Cpu));
            let want = x
                .to_kind(Kind::Double)
                .linear::<Tensor>(&wd.to_kind(Kind::Double), None);
            let want: Vec<f64> = Vec::try_from(&want.flatten(0, -1)).expect("vec");
            let xv: Vec<f32> = Vec::try_from(&x.flatten(0, -1)).expect("x");
            let wv: Vec<f32> = Vec::try_from(&wd.flatten(0, -1)).expect("w");
            for acts in ACTIVATIONS {
                let got = run(&w, &x, acts, Kernel::best());
                for (i, (&g, &e)) in got.iter().zip(&want).enumerate() {
                    let (r, c) = (i / n, i % n);
                    let (xr, wr) = (&xv[r * k..(r + 1) * k], &wv[c * k..(c + 1) * k]);
                    let rounding: f64 = xr.iter().zip(wr).map(|(a, b)| (a * b).abs() as f64).sum();
                    let quant: f64 = xr
                        .chunks(QK)
                        .zip(wr.chunks(QK))
                        .map(|(xb, wb)| {
                            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
                            amax / 254.0 * wb.iter().map(|v| v.abs() as f64).sum::<f64>()
                        })
                        .sum();
                    let bound = 1e-5 * rounding
                        + match acts {
                            Activations::Int8 => 1.001 * quant,
                            Activations::Int8Residual => 1.01 * quant / 128.0,
                            Activations::F32 => 0.0,
                        };
                    let err = (g as f64 - e).abs();
                    assert!(
                        err <= bound,
                        "{fmt:?} {acts:?} n={n} k={k} row {r} col {c}: {g} vs {e} (error {err:.3e} > {bound:.3e})"
                    );
                }
            }
        }
    }
}

/// The int8 kernels compute exactly the dequantized weights times the
/// rounded activations (`dx q`, and `dx q + dx/128 q2` with the residual,
/// rounded as the kernel rounds them), within float32 rounding
/// (`1e-5 * sum |w_k x'_k|`, tight enough that one quant off by one in a
/// block fails).
#[test]
fn int8_kernel_is_the_product_with_the_rounded_activations() {
    tch::manual_seed(14);
    for fmt in FORMATS {
        let (n, k) = (48usize, fit(fmt, 576));
        let rows = random_rows(fmt, n, k, 31);
        let w = QuantMatrix::new(&rows);
        let wv: Vec<f32> = Vec::try_from(&rows.dequantize().expect("w").flatten(0, -1)).expect("w");
        let x = Tensor::randn([3, k as i64], (Kind::Float, Device::Cpu));
        let xv: Vec<f32> = Vec::try_from(&x.flatten(0, -1)).expect("x");
        for (acts, residual) in [
            (Activations::Int8, false),
            (Activations::Int8Residual, true),
        ] {
            let rounded: Vec<f64> = xv
                .chunks(QK)
                .flat_map(|b| {
                    let dx = b.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                    let inv = if dx > 0.0 { 1.0 / dx } else { 0.0 };
                    b.iter()
                        .map(move |&v| {
                            let q = (v * inv).round();
                            let q2 = if residual {
                                ((v - dx * q) * (inv * 128.0)).round()
                            } else {
                                0.0
                            };
                            q as f64 * dx as f64 + q2 as f64 * (dx / 128.0) as f64
                        })
                        .collect::<Vec<_>>()
                })
                .collect();
            for kernel in kernels() {
                let got = run(&w, &x, acts, kernel);
                for (i, &g) in got.iter().enumerate() {
                    let (r, c) = (i / n, i % n);
                    let (xr, wr) = (&rounded[r * k..(r + 1) * k], &wv[c * k..(c + 1) * k]);
                    let want: f64 = xr.iter().zip(wr).map(|(a, &b)| a * b as f64).sum();
                    let scale: f64 = xr.iter().zip(wr).map(|(a, &b)| (a * b as f64).abs()).sum();
                    let err = (g as f64 - want).abs();
                    assert!(
                        err <= 1e-5 * scale,
                        "{fmt:?} {acts:?} {kernel:?} row {r} col {c}: {g} vs {want} ({err:.3e})"
                    );
                }
            }
        }
    }
}

/// A row's outputs are the same, to the bit, alone and in batches of any
/// size (tiles of 1 to 8 rows and a ragged last tile).
#[test]
fn a_row_is_the_same_alone_and_in_a_batch() {
    tch::manual_seed(12);
    for fmt in FORMATS {
        let k = fit(fmt, 128);
        let w = QuantMatrix::new(&random_rows(fmt, 48, k, 3));
        let x = Tensor::randn([13, k as i64], (Kind::Float, Device::Cpu));
        for acts in ACTIVATIONS {
            for kernel in kernels() {
                let row = 4usize;
                let alone = run(&w, &x.narrow(0, row as i64, 1), acts, kernel);
                for m in [5i64, 8, 9, 13] {
                    let all = run(&w, &x.narrow(0, 0, m), acts, kernel);
                    assert_eq!(
                        all[row * 48..(row + 1) * 48],
                        alone[..],
                        "{fmt:?} {acts:?} {kernel:?} m={m}"
                    );
                }
            }
        }
    }
}

/// The SIMD and portable kernels do the same operations in the same order,
/// so every kernel this CPU runs agrees with the portable one to the bit
/// (every tile height, a ragged last group; activations with all-zero
/// blocks and blocks whose largest value is negative). On x86-64 with
/// AVX2 at least one SIMD kernel must run.
#[test]
fn simd_and_portable_kernels_agree_exactly() {
    let simd: Vec<Kernel> = kernels()
        .into_iter()
        .filter(|&k| k != Kernel::Portable)
        .collect();
    if cfg!(target_arch = "x86_64") && std::arch::is_x86_feature_detected!("avx2") {
        assert!(!simd.is_empty(), "no SIMD kernel runs on an AVX2 CPU");
    }
    tch::manual_seed(13);
    for fmt in FORMATS {
        let k = fit(fmt, 320);
        let w = QuantMatrix::new(&random_rows(fmt, 40, k, 5));
        let x = Tensor::randn([8, k as i64], (Kind::Float, Device::Cpu)) * 3.0;
        let _ = x.narrow(1, 0, 32).fill_(0.0);
        let _ = x.narrow(1, 32, 32).fill_(-2.5);
        for acts in ACTIVATIONS {
            for m in 1..=8 {
                let x = x.narrow(0, 0, m);
                let want = run(&w, &x, acts, Kernel::Portable);
                for &kernel in &simd {
                    let got = run(&w, &x, acts, kernel);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(p, q)| p.to_bits() == q.to_bits());
                    assert!(same, "{fmt:?} {acts:?} {kernel:?} m={m}");
                }
            }
        }
    }
}

/// The AVX2 panel product (every format, with the residual or int8
/// alone, from 4 rows):
/// panels of every width (1 to 6 groups, a partial last group), row
/// parts past 64 and the threads' splits give the portable kernel's bits.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_panel_agrees_exactly_at_every_width() {
    assert!(
        Kernel::Avx2.runs_here(),
        "this test needs an x86-64 CPU with AVX2, FMA and F16C"
    );
    tch::manual_seed(17);
    // Panels of 6 and 2 groups (one thread), 4 (two), 3 (three); 5; 1.
    for (fmt, n) in FORMATS
        .into_iter()
        .flat_map(|f| [(f, 16 * 13 + 5), (f, 16 * 10), (f, 17)])
    {
        let k = fit(fmt, 256);
        let w = QuantMatrix::new(&random_rows(fmt, n, k, 21));
        let x = Tensor::randn([130, k as i64], (Kind::Float, Device::Cpu)) * 3.0;
        let _ = x.narrow(1, 0, 32).fill_(0.0);
        for m in [4i64, 5, 7, 33, 64, 65, 130] {
            let x = x.narrow(0, 0, m);
            let xs = crate::attn::f32_view(&x).expect("view");
            let m = m as usize;
            let one = crate::gemm::Workers::new(1).expect("workers");
            for acts in [Activations::Int8Residual, Activations::Int8] {
                let mut want = vec![0f32; m * n];
                w.matmul(xs, m, acts, Kernel::Portable, &one, &mut want);
                for threads in [1, 2, 3] {
                    let workers = crate::gemm::Workers::new(threads).expect("workers");
                    let mut got = vec![f32::NAN; m * n];
                    w.matmul(xs, m, acts, Kernel::Avx2, &workers, &mut got);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(p, q)| p.to_bits() == q.to_bits());
                    assert!(same, "{fmt:?} {acts:?} m={m} threads={threads}");
                }
            }
        }
    }
}

/// A row read back from the repacked layout (the embedding lookup) is
/// ggml's dequantization of it, bit for bit.
#[test]
fn rows_read_back_as_ggml_dequantizes_them() {
    for fmt in FORMATS {
        let rows = random_rows(fmt, 37, fit(fmt, 96), 9);
        let w = QuantMatrix::new(&rows);
        let ids = [0i64, 36, 17, 16, 17];
        let got = w.rows(&ids).expect("rows");
        let want = rows
            .dequantize()
            .expect("dequantize")
            .index_select(0, &Tensor::from_slice(&ids));
        assert!(got.equal(&want), "{fmt:?}");
        assert!(w.rows(&[37]).is_err(), "{fmt:?}: an id past the rows");
    }
}

/// The GGUF types converted at load (Q4_K's and Q6_K's super-blocks split
/// into 32-value blocks, Q5_0's blocks widened to Q8_0's) dequantize, bit
/// for bit, as ggml's reference dequantizes the file's blocks
/// (`dequant.rs`, checked against the `gguf` package elsewhere): every
/// sub-block scale and min, every high bit.
#[test]
fn converted_types_dequantize_as_ggml() {
    use crate::gguf::GgmlType;
    let (n, k) = (9usize, 768usize);
    for (kind, held) in [
        (GgmlType::Q4K, Format::Q4K),
        (GgmlType::Q6K, Format::Q6K),
        (GgmlType::Q5_0, Format::Q8_0),
    ] {
        let raw = random_ggml_of(kind, n, k, 41);
        let want = crate::gguf::dequantize(kind, &raw, n * k).expect("ggml");
        let rows = QuantRows::from_ggml(kind, n, k, &raw).expect("rows");
        assert_eq!(rows.format(), held, "{kind:?}");
        let got: Vec<f32> =
            Vec::try_from(&rows.dequantize().expect("dequantize").flatten(0, -1)).expect("vec");
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{kind:?} value {i}: {g} vs {w}");
        }
        // The kernels see the same weights: a product with one-hot rows
        // reads the dequantized values back exactly (f32 activations, no
        // rounding; a zero's sign may differ, the sum starting at +0), in
        // both halves of a block and across super-blocks.
        let w = QuantMatrix::new(&rows);
        let eye = Tensor::eye(k as i64, (Kind::Float, Device::Cpu));
        for r0 in [0i64, 256, 704] {
            let prod = run(&w, &eye.narrow(0, r0, 64), Activations::F32, Kernel::best());
            for r in 0..64 {
                for c in 0..n {
                    let (g, e) = (prod[r * n + c], want[c * k + r0 as usize + r]);
                    assert!(g == e, "{kind:?} {r} {c}: {g} vs {e}");
                }
            }
        }
        assert!(
            QuantRows::from_ggml(kind, n, 640 + 16, &raw).is_err(),
            "{kind:?} bad width"
        );
        assert!(
            QuantRows::from_ggml(kind, n, k, &raw[1..]).is_err(),
            "{kind:?} short data"
        );
    }
    assert!(
        QuantRows::from_ggml(GgmlType::Q5K, 1, 256, &[0; 176]).is_err(),
        "Q5_K is not held"
    );
}

/// Permuting and stacking rows in ggml's layout is permuting and stacking
/// the dequantized rows.
#[test]
fn permuted_and_stacked_rows_match_the_dequantized_ones() {
    let a = random_rows(Format::Q4_1, 6, 64, 21);
    let b = random_rows(Format::Q4_1, 2, 64, 22);
    let perm = [3usize, 0, 5, 1, 4, 2];
    let p = a.permute_rows(&perm);
    let idx = Tensor::from_slice(&perm.map(|i| i as i64));
    let want = a.dequantize().expect("a").index_select(0, &idx);
    assert!(p.dequantize().expect("p").equal(&want));
    let cat = QuantRows::cat(&[&a, &b]).expect("cat");
    let want = Tensor::cat(&[a.dequantize().expect("a"), b.dequantize().expect("b")], 0);
    assert!(cat.dequantize().expect("cat").equal(&want));
    let other = random_rows(Format::Q8_0, 2, 64, 23);
    assert!(QuantRows::cat(&[&a, &other]).is_none(), "formats differ");
}

/// The repacked weight keeps the format's bits per weight.
#[test]
fn repacking_keeps_the_size() {
    for fmt in FORMATS {
        let rows = random_rows(fmt, 64, 256, 1);
        assert_eq!(QuantMatrix::new(&rows).bytes(), rows.bytes(), "{fmt:?}");
    }
}

#[test]
fn rejects_a_mismatched_input() {
    let w = QuantMatrix::new(&random_rows(Format::Q8_0, 16, 64, 2));
    let x = Tensor::zeros([2, 63], (Kind::Float, Device::Cpu));
    assert!(w.forward(&x, Activations::Int8, &pool()).is_err());
}

/// The product with the SiLU in its tasks (`forward_silu`) is, to the bit,
/// the product (`forward`) then the CPU's `silu_mul`: at one row and a few
/// (the group kernels), at the panel product's 4 and 16 rows and at 70
/// (two parts of rows), for every format and kind of activations, with a
/// gate of 13 groups (chunks of 4, 4, 4 and 1 on two threads). A gate that
/// is not a whole number of groups is not taken.
#[test]
fn silu_in_the_product_is_the_product_then_silu() {
    tch::manual_seed(5);
    let workers = pool();
    let inter = 13 * NG;
    for fmt in FORMATS {
        let k = fit(fmt, 64);
        let w = QuantMatrix::new(&random_rows(fmt, 2 * inter, k, 9));
        for m in [1i64, 3, 4, 16, 70] {
            let x = Tensor::randn([m, k as i64], (Kind::Float, Device::Cpu));
            for acts in ACTIVATIONS {
                let gu = w.forward(&x, acts, &workers).expect("forward");
                let want = crate::fused::cpu::silu_mul(&gu, inter as i64).expect("silu");
                let got = w
                    .forward_silu(&x, acts, &workers)
                    .expect("fused")
                    .expect("a whole number of groups");
                assert_eq!(got.size(), [m, inter as i64]);
                let (got, want) = (
                    crate::attn::f32_view(&got).expect("got").to_vec(),
                    crate::attn::f32_view(&want).expect("want").to_vec(),
                );
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{fmt:?}, {m} rows, {acts:?}: differs");
            }
        }
    }
    let w = QuantMatrix::new(&random_rows(Format::Q8_0, 2 * 40, 32, 3));
    let x = Tensor::randn([2, 32], (Kind::Float, Device::Cpu));
    let taken = w.forward_silu(&x, Activations::Int8Residual, &workers);
    assert!(taken.expect("no error").is_none());
}
