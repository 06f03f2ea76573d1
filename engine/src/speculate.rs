//! Prompt-lookup decoding: a sequence that is decoding proposes the tokens
//! that followed an earlier occurrence of its latest n-gram (in its prompt
//! or its output so far), and the next step computes them all in one
//! forward pass beside its last token. Each proposed token is then checked
//! in order against what the model samples at that position: while they
//! agree, the proposal is accepted and the next row is used; at the first
//! disagreement the sampled token is kept and the rest are dropped (their
//! keys and values are simply overwritten later).
//!
//! Why this is exact: the proposal is deterministic (a point mass), so
//! accepting it with probability p(x) and otherwise sampling from p without
//! x renormalized — the speculative-sampling rule — is the same as sampling
//! from p and comparing. Every row is sampled with the sampler's state
//! after the tokens before it (penalties, constraints, seeds), as plain
//! decoding would sample it; greedy output is token for token the same.
//!
//! The search follows transformers' `PromptLookupCandidateGenerator`: the
//! longest n-gram first (from `max_ngram` down to 1), its earliest earlier
//! occurrence with at least one token after it, and up to `num_tokens`
//! tokens from there.

/// A request's speculation settings (prompt lookup).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speculation {
    /// Most tokens proposed per step (OpenVINO's `num_assistant_tokens`,
    /// transformers' `prompt_lookup_num_tokens`).
    pub num_tokens: u32,
    /// Longest n-gram matched (OpenVINO's `max_ngram_size`).
    pub max_ngram: u32,
}

/// Most tokens one step may propose for a sequence.
pub const MAX_SPECULATIVE_TOKENS: u32 = 64;

/// Longest n-gram the search matches.
pub const MAX_NGRAM: u32 = 16;

/// Tokens to propose after `tokens`: at most `k`, following the earliest
/// earlier occurrence of the longest suffix n-gram (at most `max_ngram`
/// long) that has any.
pub fn lookup(tokens: &[u32], max_ngram: usize, k: usize) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 {
        return Vec::new();
    }
    for n in (1..=max_ngram.min(len.saturating_sub(1))).rev() {
        let gram = &tokens[len - n..];
        // Occurrences starting before the suffix itself, with a token after.
        for start in 0..len - n {
            if &tokens[start..start + n] == gram {
                let from = start + n;
                let to = (from + k).min(len);
                if from < to {
                    return tokens[from..to].to_vec();
                }
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::lookup;

    #[test]
    fn the_longest_ngram_wins_and_its_earliest_occurrence() {
        //          0  1  2  3  4  5  6  7  8  9
        let toks = [1, 2, 3, 4, 9, 2, 3, 5, 1, 2];
        // Suffix [1, 2] occurs at 0: propose what followed it.
        assert_eq!(lookup(&toks, 2, 3), vec![3, 4, 9]);
        // With unigrams only, `2` first occurs at 1, followed by 3, 4.
        assert_eq!(lookup(&toks, 1, 2), vec![3, 4]);
        // The proposal stops at the end of the sequence.
        assert_eq!(lookup(&[7, 8, 7], 1, 5), vec![8, 7]);
    }

    #[test]
    fn nothing_to_propose() {
        assert!(lookup(&[1, 2, 3], 2, 4).is_empty());
        assert!(lookup(&[5], 3, 4).is_empty());
        assert!(lookup(&[], 3, 4).is_empty());
        assert!(lookup(&[4, 4, 4], 2, 0).is_empty());
        // A repeated token proposes itself.
        assert_eq!(lookup(&[4, 4], 2, 3), vec![4]);
    }
}
