//! Stop strings: finds the first stop string in generated text and holds
//! back any tail that could still become one, so a stop string never leaks
//! into the output, even when it spans several tokens.

pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released (a possible start of a stop string).
    held: String,
}

/// What a new piece of text gave.
#[derive(Debug, PartialEq, Eq)]
pub enum StopOutcome {
    /// Text safe to release now (may be empty).
    Continue(String),
    /// A stop string matched: the text before it, and the stop string.
    Stopped(String, String),
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            held: String::new(),
        }
    }

    pub fn push(&mut self, piece: &str) -> StopOutcome {
        if self.stops.is_empty() {
            return StopOutcome::Continue(piece.to_string());
        }
        self.held.push_str(piece);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, s)) = first {
            let before = self.held[..at].to_string();
            let stop = s.clone();
            self.held.clear();
            return StopOutcome::Stopped(before, stop);
        }
        let out = crate::holdback::release(&mut self.held, self.stops.iter().map(String::as_str));
        StopOutcome::Continue(out)
    }

    /// Releases what is held back (generation ended without a match).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            match m.push(p) {
                StopOutcome::Continue(t) => out.push_str(&t),
                StopOutcome::Stopped(t, s) => {
                    out.push_str(&t);
                    return (out, Some(s));
                }
            }
        }
        out.push_str(&m.finish());
        (out, None)
    }

    #[test]
    fn stop_spanning_pieces_never_leaks() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "D more"]),
            ("hello ".into(), Some("END".into()))
        );
    }

    #[test]
    fn partial_match_released_when_it_diverges() {
        assert_eq!(
            run(&["END"], &["a E", "Nx", " b"]),
            ("a ENx b".into(), None)
        );
    }

    #[test]
    fn multibyte_and_earliest_stop_wins() {
        assert_eq!(
            run(&["。", "日本"], &["こんにち", "は日", "本語。"]),
            ("こんにちは".into(), Some("日本".into()))
        );
    }

    #[test]
    fn no_stops_pass_through() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), None));
    }
}
