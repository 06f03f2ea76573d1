//! Constrained decoding: a per-sequence llguidance matcher that masks the
//! logits before sampling and follows each sampled token.

use llguidance::Matcher;

/// The structure one sequence's output must keep to. Cloning gives an
/// independent matcher in the same state (for the choices of n > 1).
pub struct Constraint(Matcher);

impl Constraint {
    pub fn new(matcher: Matcher) -> Self {
        Self(matcher)
    }

    /// Sets every token the structure does not allow next to -inf. Once the
    /// structure is complete only EOS is allowed, so generation ends.
    pub(crate) fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let allowed = self.0.compute_mask_or_eos().map_err(|e| e.to_string())?;
        for (i, x) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(i as u32) {
                *x = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advances past a sampled token.
    pub(crate) fn consume(&mut self, token: u32) -> Result<(), String> {
        if self.0.is_stopped() {
            return Ok(());
        }
        self.0.consume_token(token).map_err(|e| e.to_string())
    }
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Self(self.0.deep_clone())
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Constraint")
    }
}
