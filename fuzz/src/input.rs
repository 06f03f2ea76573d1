//! Turning fuzzer bytes into test inputs: a few header bytes pick options,
//! the rest is the payload, and a seeded split cuts text into the pieces a
//! stream would deliver.

/// A small deterministic generator (SplitMix64) seeded from the input, so a
/// crash reproduces from its bytes alone.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `1..=max`.
    pub fn up_to(&mut self, max: usize) -> usize {
        1 + (self.next_u64() % max as u64) as usize
    }
}

/// Cuts `text` into pieces of 1 to `max` characters (never inside a
/// character), as a token stream would deliver it.
pub fn pieces<'a>(text: &'a str, rng: &mut Rng, max: usize) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let take = rng.up_to(max);
        let cut = rest
            .char_indices()
            .nth(take)
            .map_or(rest.len(), |(at, _)| at);
        let (head, tail) = rest.split_at(cut);
        out.push(head);
        rest = tail;
    }
    out
}

/// The first `n` bytes as options and the rest as the payload; None when
/// the input is shorter than the options.
pub fn split_header(data: &[u8], n: usize) -> Option<(&[u8], &[u8])> {
    (data.len() >= n).then(|| data.split_at(n))
}
