//! Dequantization of ggml tensor data to f32.
//!
//! Each kernel follows ggml's reference C (`ggml-quants.c`,
//! `dequantize_row_*`) operation for operation, in f32 and without fused
//! multiply-adds, so the results are bit-identical to ggml's reference and to
//! the `gguf` Python package's numpy port (the engine's tests check that,
//! type by type, against the package).

/// The ggml types gyre can read, with their ids in GGUF files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

/// Elements in a K-quant super-block.
const QK_K: usize = 256;

impl GgmlType {
    /// The names of the readable types, for error messages.
    pub const SUPPORTED: &'static str =
        "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K";

    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            30 => Self::BF16,
            _ => return None,
        })
    }

    /// (elements per block, bytes per block).
    pub fn block(self) -> (usize, usize) {
        match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::BF16 => (1, 2),
            Self::Q4_0 => (32, 2 + 16),
            Self::Q4_1 => (32, 2 + 2 + 16),
            Self::Q5_0 => (32, 2 + 4 + 16),
            Self::Q5_1 => (32, 2 + 2 + 4 + 16),
            Self::Q8_0 => (32, 2 + 32),
            Self::Q4K => (QK_K, 2 + 2 + 12 + QK_K / 2),
            Self::Q5K => (QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2),
            Self::Q6K => (QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2),
        }
    }
}

/// ggml's name of type `id`, known or not (for error messages).
pub fn type_name(id: u32) -> String {
    const NAMES: [&str; 42] = [
        "F32",
        "F16",
        "Q4_0",
        "Q4_1",
        "Q4_2",
        "Q4_3",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q8_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "Q8_K",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ3_XXS",
        "IQ1_S",
        "IQ4_NL",
        "IQ3_S",
        "IQ2_S",
        "IQ4_XS",
        "I8",
        "I16",
        "I32",
        "I64",
        "F64",
        "IQ1_M",
        "BF16",
        "Q4_0_4_4",
        "Q4_0_4_8",
        "Q4_0_8_8",
        "TQ1_0",
        "TQ2_0",
        "IQ4_NL_4_4",
        "IQ4_NL_4_8",
        "IQ4_NL_8_8",
        "MXFP4",
        "NVFP4",
        "?",
    ];
    match NAMES.get(id as usize) {
        Some(name) if *name != "?" => format!("{name} (ggml type {id})"),
        _ => format!("ggml type {id}"),
    }
}

/// IEEE half to single precision (exact; subnormals, infinities, NaN kept).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let mant = u32::from(h & 0x3ff);
    let bits = match (exp, mant) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: normalise the mantissa.
            let shift = m.leading_zeros() - 21;
            let m = (m << shift) & 0x3ff;
            sign | ((113 - shift) << 23) | (m << 13)
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

/// Dequantizes `n` elements of `kind` from `data` (exactly the bytes of
/// `n / block` blocks). Errors say what does not fit.
pub fn dequantize(kind: GgmlType, data: &[u8], n: usize) -> Result<Vec<f32>, String> {
    let (block, bytes) = kind.block();
    if !n.is_multiple_of(block) {
        return Err(format!(
            "{n} elements are not whole {kind:?} blocks of {block}"
        ));
    }
    if data.len() != n / block * bytes {
        return Err(format!(
            "{} bytes for {n} {kind:?} elements, expected {}",
            data.len(),
            n / block * bytes
        ));
    }
    let mut out = vec![0f32; n];
    let blocks = data.chunks_exact(bytes).zip(out.chunks_exact_mut(block));
    match kind {
        GgmlType::F32 => {
            blocks.for_each(|(b, y)| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
        GgmlType::F16 => blocks.for_each(|(b, y)| y[0] = f16_at(b, 0)),
        GgmlType::BF16 => blocks.for_each(|(b, y)| {
            y[0] = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
        }),
        GgmlType::Q4_0 => blocks.for_each(|(b, y)| q4_0(b, y)),
        GgmlType::Q4_1 => blocks.for_each(|(b, y)| q4_1(b, y)),
        GgmlType::Q5_0 => blocks.for_each(|(b, y)| q5_0(b, y)),
        GgmlType::Q5_1 => blocks.for_each(|(b, y)| q5_1(b, y)),
        GgmlType::Q8_0 => blocks.for_each(|(b, y)| q8_0(b, y)),
        GgmlType::Q4K => blocks.for_each(|(b, y)| q4_k(b, y)),
        GgmlType::Q5K => blocks.for_each(|(b, y)| q5_k(b, y)),
        GgmlType::Q6K => blocks.for_each(|(b, y)| q6_k(b, y)),
    }
    Ok(out)
}

fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = ((qs[j] & 0x0f) as i32 - 8) as f32 * d;
        y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qs = &b[4..20];
    for j in 0..16 {
        y[j] = (qs[j] & 0x0f) as f32 * d + m;
        y[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

/// The fifth bits of a Q5 block's 32 values, as 0 or 16.
pub(crate) fn q5_high(qh: u32, j: usize) -> (u8, u8) {
    (
        (((qh >> j) << 4) & 0x10) as u8,
        ((qh >> (j + 12)) & 0x10) as u8,
    )
}

fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let (h0, h1) = q5_high(qh, j);
        y[j] = (((qs[j] & 0x0f) | h0) as i32 - 16) as f32 * d;
        y[j + 16] = (((qs[j] >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let (h0, h1) = q5_high(qh, j);
        y[j] = ((qs[j] & 0x0f) | h0) as f32 * d + m;
        y[j + 16] = ((qs[j] >> 4) | h1) as f32 * d + m;
    }
}

fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..34]) {
        *y = (q as i8) as f32 * d;
    }
}

/// Scale and min of sub-block `j` from a K-quant's packed 6-bit scales.
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, min) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qs = &b[16..16 + QK_K / 2];
    for (chunk, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0x0f) as f32 - m1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, min) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..16 + QK_K / 8];
    let ql = &b[16 + QK_K / 8..];
    for (chunk, (q, y)) in ql.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let (u1, u2) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((q[l] & 0x0f) + h1) as f32 - m1;
            y[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
        }
    }
}

fn q6_k(b: &[u8], y: &mut [f32]) {
    let ql_all = &b[..QK_K / 2];
    let qh_all = &b[QK_K / 2..QK_K / 2 + QK_K / 4];
    let sc_all = &b[QK_K / 2 + QK_K / 4..QK_K / 2 + QK_K / 4 + QK_K / 16];
    let d = f16_at(b, QK_K / 2 + QK_K / 4 + QK_K / 16);
    for half in 0..2 {
        let ql = &ql_all[64 * half..];
        let qh = &qh_all[32 * half..];
        let sc = &sc_all[8 * half..];
        let y = &mut y[128 * half..];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let s = |k: usize| d * (sc[is + k] as i8) as f32;
            y[l] = s(0) * q1 as f32;
            y[l + 32] = s(2) * q2 as f32;
            y[l + 64] = s(4) * q3 as f32;
            y[l + 96] = s(6) * q4 as f32;
        }
    }
}
