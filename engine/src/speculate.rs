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
//! tokens from there. A shortest n-gram (`min_ngram`, vLLM's
//! `prompt_lookup_min`) stops the search before the shorter ones: with 1
//! (the default) it is transformers' search.
//!
//! A request may also give a predicted output (OpenAI's Predicted
//! Outputs: text the answer will largely repeat). It is searched first,
//! with the longest context it shares with the sequence, and the
//! sequence's own lookup is the fallback. Exactness is the same: a
//! prediction only changes what is proposed.

/// A request's speculation settings (prompt lookup).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speculation {
    /// Most tokens proposed per step (OpenVINO's `num_assistant_tokens`,
    /// transformers' `prompt_lookup_num_tokens`).
    pub num_tokens: u32,
    /// Longest n-gram matched (OpenVINO's `max_ngram_size`, vLLM's
    /// `prompt_lookup_max`).
    pub max_ngram: u32,
    /// Shortest n-gram matched (vLLM's `prompt_lookup_min`): n-grams from
    /// `max_ngram` down to this are tried. 0 and 1 both go down to single
    /// tokens (transformers' search); above `max_ngram`, nothing matches.
    pub min_ngram: u32,
}

/// Most tokens one step may propose for a sequence.
pub const MAX_SPECULATIVE_TOKENS: u32 = 64;

/// Longest n-gram the search matches.
pub const MAX_NGRAM: u32 = 16;

/// Tokens to propose after `tokens`: at most `k`, following the earliest
/// earlier occurrence of the longest suffix n-gram (at most `max_ngram`
/// long, at least `min_ngram`, and at least 1) that has any.
pub fn lookup(tokens: &[u32], min_ngram: usize, max_ngram: usize, k: usize) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 {
        return Vec::new();
    }
    for n in (min_ngram.max(1)..=max_ngram.min(len.saturating_sub(1))).rev() {
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

/// Tokens to propose from a predicted output (OpenAI's Predicted
/// Outputs): at most `k`, following the earliest occurrence in `predicted`
/// of the longest suffix n-gram of `tokens` (up to [`MAX_NGRAM`] long: a
/// prediction is matched with as much context as it shares, down to a
/// single token whatever `min_ngram` says) that has any; else what
/// [`lookup`] proposes from the sequence itself.
pub fn lookup_predicted(
    predicted: &[u32],
    tokens: &[u32],
    min_ngram: usize,
    max_ngram: usize,
    k: usize,
) -> Vec<u32> {
    if k == 0 {
        return Vec::new();
    }
    let longest = (MAX_NGRAM as usize).min(tokens.len()).min(predicted.len());
    for n in (1..=longest).rev() {
        let gram = &tokens[tokens.len() - n..];
        if let Some(start) = predicted.windows(n).position(|w| w == gram) {
            let from = start + n;
            if from < predicted.len() {
                return predicted[from..(from + k).min(predicted.len())].to_vec();
            }
        }
    }
    lookup(tokens, min_ngram, max_ngram, k)
}

#[cfg(test)]
mod tests {
    use super::{lookup, lookup_predicted};

    #[test]
    fn a_prediction_is_matched_with_its_longest_context_first() {
        //               0  1  2  3  4  5  6
        let predicted = [5, 6, 7, 5, 6, 8, 9];
        // [7, 5, 6] is in the prediction: what follows it (8, 9), not what
        // follows the earlier [5, 6].
        assert_eq!(
            lookup_predicted(&predicted, &[1, 7, 5, 6], 1, 2, 4),
            vec![8, 9]
        );
        // Only the unigram [6] matches: its earliest occurrence.
        assert_eq!(
            lookup_predicted(&predicted, &[1, 2, 6], 1, 2, 2),
            vec![7, 5]
        );
        // Nothing in the prediction: the sequence's own lookup.
        assert_eq!(
            lookup_predicted(&predicted, &[3, 4, 3], 1, 2, 2),
            vec![4, 3]
        );
        // A match at the prediction's end has nothing to propose.
        assert_eq!(lookup_predicted(&[1, 2], &[2], 1, 2, 3), Vec::<u32>::new());
        assert!(lookup_predicted(&predicted, &[5, 6], 1, 2, 0).is_empty());
    }

    #[test]
    fn the_longest_ngram_wins_and_its_earliest_occurrence() {
        //          0  1  2  3  4  5  6  7  8  9
        let toks = [1, 2, 3, 4, 9, 2, 3, 5, 1, 2];
        // Suffix [1, 2] occurs at 0: propose what followed it.
        assert_eq!(lookup(&toks, 1, 2, 3), vec![3, 4, 9]);
        // With unigrams only, `2` first occurs at 1, followed by 3, 4.
        assert_eq!(lookup(&toks, 1, 1, 2), vec![3, 4]);
        // The proposal stops at the end of the sequence.
        assert_eq!(lookup(&[7, 8, 7], 1, 1, 5), vec![8, 7]);
    }

    #[test]
    fn nothing_to_propose() {
        assert!(lookup(&[1, 2, 3], 1, 2, 4).is_empty());
        assert!(lookup(&[5], 1, 3, 4).is_empty());
        assert!(lookup(&[], 1, 3, 4).is_empty());
        assert!(lookup(&[4, 4, 4], 1, 2, 0).is_empty());
        // A repeated token proposes itself.
        assert_eq!(lookup(&[4, 4], 1, 2, 3), vec![4]);
    }

    #[test]
    fn the_shortest_ngram_bounds_the_search() {
        //          0  1  2  3  4  5  6  7  8  9
        let toks = [1, 2, 3, 4, 9, 2, 3, 5, 1, 2];
        // [1, 2] matches at 0 with min 2, as with min 1.
        assert_eq!(lookup(&toks, 2, 2, 3), vec![3, 4, 9]);
        // No 3-gram ends the sequence earlier: min 3 proposes nothing,
        // where min 1 or 2 falls back to [1, 2].
        assert!(lookup(&toks, 3, 3, 3).is_empty());
        assert_eq!(lookup(&toks, 2, 3, 3), vec![3, 4, 9]);
        //        0  1  2  3  4  5
        let uni = [6, 7, 8, 1, 2, 8];
        // Only the unigram [8] recurs: min 1 proposes what followed it,
        // min 2 nothing; 0 counts as 1.
        assert_eq!(lookup(&uni, 1, 2, 2), vec![1, 2]);
        assert_eq!(lookup(&uni, 0, 2, 2), vec![1, 2]);
        assert!(lookup(&uni, 2, 2, 2).is_empty());
        // A minimum above the maximum matches nothing.
        assert!(lookup(&toks, 3, 2, 3).is_empty());
    }

    #[test]
    fn a_prediction_ignores_the_shortest_ngram_but_the_fallback_does_not() {
        let predicted = [5, 6, 7];
        // The unigram [6] of the prediction still matches with min 2.
        assert_eq!(lookup_predicted(&predicted, &[1, 6], 2, 2, 2), vec![7]);
        // Nothing in the prediction: the sequence's own lookup, from 2 up.
        assert!(lookup_predicted(&predicted, &[3, 4, 3], 2, 2, 2).is_empty());
        assert_eq!(
            lookup_predicted(&predicted, &[3, 4, 3], 1, 2, 2),
            vec![4, 3]
        );
    }
}
