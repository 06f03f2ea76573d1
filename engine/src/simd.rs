//! Which x86 vector extensions the CPU has, detected once: the CPU kernels
//! pick their AVX-512 or AVX2 build from it (the same operations in each,
//! so the same results), or the portable code.

/// The widest vector kernels this CPU runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Simd {
    /// AVX-512F (16 floats a vector, 32 registers).
    Avx512,
    /// AVX2 with FMA (8 floats a vector, 16 registers).
    Avx2,
    /// Neither (or not x86-64): the portable code.
    None,
}

impl Simd {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Self::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Self::Avx2;
            }
        }
        Self::None
    }
}

/// [`Simd::detect`], run once.
pub(crate) fn simd() -> Simd {
    static HAS: std::sync::LazyLock<Simd> = std::sync::LazyLock::new(Simd::detect);
    *HAS
}
