//! Constrained decoding: a per-sequence llguidance matcher that masks the
//! logits before sampling and follows each sampled token.
//!
//! A constraint may wait for the end of a reasoning section: the output is
//! free until the section's end-marker tokens have been generated, and only
//! then must it keep to the structure. When the prompt did not open the
//! section, the output may begin with the start-marker tokens (then it is
//! free until the end marker) or must keep to the structure from its first
//! token.

use llguidance::Matcher;

/// The structure one sequence's output must keep to. Cloning gives an
/// independent matcher in the same state (for the choices of n > 1).
pub struct Constraint {
    matcher: Matcher,
    gate: Option<Gate>,
}

/// Where the output stands relative to a reasoning section.
#[derive(Debug, Clone)]
struct Gate {
    /// Start-marker tokens the output may begin with, and how many of them
    /// it has generated so far (`None`: the section is already open).
    start: Option<(Vec<u32>, usize)>,
    /// End-marker tokens, and the latest generated tokens to match them.
    end: Vec<u32>,
    recent: Vec<u32>,
}

impl Constraint {
    pub fn new(matcher: Matcher) -> Self {
        Self {
            matcher,
            gate: None,
        }
    }

    /// Applies the structure only after a reasoning section: after the
    /// tokens `end` appear in the output. `start`: the section is not open
    /// yet; the output may open it with these tokens first (`None`: it is
    /// open from the first token). Empty markers leave the constraint as is.
    pub fn after_section(mut self, start: Option<Vec<u32>>, end: Vec<u32>) -> Self {
        if end.is_empty() || start.as_ref().is_some_and(Vec::is_empty) {
            return self;
        }
        self.gate = Some(Gate {
            start: start.map(|s| (s, 0)),
            end,
            recent: Vec::new(),
        });
        self
    }

    /// True while the output is inside the reasoning section (sampled
    /// freely; the sampler's own rules such as min_tokens apply).
    pub(crate) fn is_free(&self) -> bool {
        self.gate.as_ref().is_some_and(|g| g.start.is_none())
    }

    /// Sets every token the structure does not allow next to -inf. Once the
    /// structure is complete only EOS is allowed, so generation ends.
    pub(crate) fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        // Part of the start marker generated: only its next token.
        if let Some(Gate {
            start: Some((ids, seen)),
            ..
        }) = &self.gate
            && *seen > 0
        {
            let next = ids[*seen] as usize;
            for (i, x) in logits.iter_mut().enumerate() {
                if i != next {
                    *x = f32::NEG_INFINITY;
                }
            }
            return Ok(());
        }
        let opener = match &self.gate {
            Some(Gate {
                start: Some((ids, _)),
                ..
            }) => Some(ids[0]),
            _ => None,
        };
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())?;
        for (i, x) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(i as u32) && opener != Some(i as u32) {
                *x = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advances past a sampled token.
    pub(crate) fn consume(&mut self, token: u32) -> Result<(), String> {
        if let Some(g) = self.gate.as_mut() {
            match &mut g.start {
                Some((ids, seen)) if ids[*seen] == token => {
                    *seen += 1;
                    if *seen == ids.len() {
                        g.start = None;
                    }
                    return Ok(());
                }
                // The output did not open a section: structure from here on.
                Some(_) => self.gate = None,
                None => {
                    g.recent.push(token);
                    if g.recent.len() > g.end.len() {
                        g.recent.remove(0);
                    }
                    if g.recent == g.end {
                        self.gate = None;
                    }
                    return Ok(());
                }
            }
        }
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
            gate: self.gate.clone(),
        }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Constraint")
    }
}
