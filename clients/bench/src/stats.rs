//! Per-request records and their aggregates: TTFT, inter-token latency
//! (p50/p99), time per output token, output tokens per second.
//!
//! Everything here is pure (no I/O): the clients fill [`Record`]s, and
//! [`Summary::of`] turns a run's records into the figures the report shows.
//! Latencies are reported in milliseconds.

use std::time::Duration;

use serde::Serialize;

/// How a request ended, as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The server sent its final event (`Finish` / `[DONE]`) with this reason.
    Finished(String),
    /// The client dropped the stream on purpose (`cancel_after`).
    Cancelled,
    /// The call failed (status, HTTP error, transport).
    Error(String),
}

/// What one streamed request looked like from the client.
#[derive(Debug, Clone)]
pub struct Record {
    /// When the request was sent, from the start of the run.
    pub sent_at: Duration,
    /// Arrival of each output event since the request was sent, with the
    /// number of tokens it carried (gRPC: its token ids; HTTP: 1 per
    /// non-empty text chunk, as token boundaries are not visible there).
    pub events: Vec<(Duration, u32)>,
    /// Tokens generated: the server's usage count when it reported one,
    /// else the sum over `events`.
    pub tokens: u32,
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    /// When the stream ended (or was dropped), since the request was sent.
    pub elapsed: Duration,
    pub outcome: Outcome,
}

impl Record {
    /// An empty record of a request sent at `sent_at`.
    pub fn new(sent_at: Duration) -> Self {
        Self {
            sent_at,
            events: Vec::new(),
            tokens: 0,
            prompt_tokens: 0,
            cached_tokens: 0,
            elapsed: Duration::ZERO,
            outcome: Outcome::Error("no response".to_owned()),
        }
    }

    /// Time to the first event carrying output.
    pub fn ttft(&self) -> Option<Duration> {
        self.events.first().map(|e| e.0)
    }

    /// Gaps between consecutive output events.
    pub fn gaps(&self) -> impl Iterator<Item = Duration> + '_ {
        self.events
            .windows(2)
            .map(|w| w[1].0.saturating_sub(w[0].0))
    }

    /// Mean time per output token after the first: (last - first event) /
    /// (tokens - 1). Unlike the event gaps this stays right when an event
    /// carries several tokens (HTTP chunks merged around held-back text).
    pub fn tpot(&self) -> Option<Duration> {
        let (first, last) = (self.events.first()?.0, self.events.last()?.0);
        let n = self.tokens.checked_sub(1).filter(|n| *n > 0)?;
        Some(last.saturating_sub(first) / n)
    }

    pub fn ok(&self) -> bool {
        !matches!(self.outcome, Outcome::Error(_))
    }
}

/// As JSON: times in milliseconds.
impl Serialize for Record {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct View<'a> {
            sent_at_ms: f64,
            ttft_ms: Option<f64>,
            elapsed_ms: f64,
            tokens: u32,
            prompt_tokens: u32,
            cached_tokens: u32,
            outcome: &'a Outcome,
            event_ms: Vec<f64>,
            event_tokens: Vec<u32>,
        }
        View {
            sent_at_ms: ms(self.sent_at),
            ttft_ms: self.ttft().map(ms),
            elapsed_ms: ms(self.elapsed),
            tokens: self.tokens,
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            outcome: &self.outcome,
            event_ms: self.events.iter().map(|e| ms(e.0)).collect(),
            event_tokens: self.events.iter().map(|e| e.1).collect(),
        }
        .serialize(serializer)
    }
}

/// Milliseconds as f64.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The p-th percentile (0..=100) of sorted values, linearly interpolated
/// between closest ranks (numpy's default). `None` when empty.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let rank = (p.clamp(0.0, 100.0) / 100.0) * last as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64))
}

/// Distribution of a sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Dist {
    pub n: usize,
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
}

impl Dist {
    /// The distribution of `values` (order irrelevant); all zero when empty.
    pub fn of(mut values: Vec<f64>) -> Self {
        values.retain(|v| v.is_finite());
        if values.is_empty() {
            return Self::default();
        }
        values.sort_by(f64::total_cmp);
        let pct = |p| percentile(&values, p).unwrap_or(0.0);
        Self {
            n: values.len(),
            mean: values.iter().sum::<f64>() / values.len() as f64,
            p50: pct(50.0),
            p99: pct(99.0),
            min: values[0],
            max: values[values.len() - 1],
        }
    }

    /// Standard error of the mean of `values`.
    pub fn sem(values: &[f64]) -> f64 {
        let n = values.len() as f64;
        if n < 2.0 {
            return 0.0;
        }
        let mean = values.iter().sum::<f64>() / n;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
        (var / n).sqrt()
    }
}

/// Aggregate of one load run.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub requests: usize,
    pub errors: usize,
    /// Up to three distinct error messages, for the report.
    pub error_samples: Vec<String>,
    pub output_tokens: u64,
    /// From the first request sent to the last stream ended.
    pub wall_s: f64,
    /// `output_tokens / wall_s`.
    pub output_tok_per_s: f64,
    pub ttft_ms: Dist,
    /// Inter-token latency: every gap between output events of a request.
    pub itl_ms: Dist,
    /// Per-request mean time per output token (see [`Record::tpot`]).
    pub tpot_ms: Dist,
    pub cached_tokens: u64,
}

impl Summary {
    pub fn of(records: &[Record]) -> Self {
        let ok: Vec<&Record> = records.iter().filter(|r| r.ok()).collect();
        let mut error_samples: Vec<String> = Vec::new();
        for r in records {
            if let Outcome::Error(e) = &r.outcome
                && error_samples.len() < 3
                && !error_samples.contains(e)
            {
                error_samples.push(e.clone());
            }
        }
        let start = records.iter().map(|r| r.sent_at).min().unwrap_or_default();
        let end = records
            .iter()
            .map(|r| r.sent_at + r.elapsed)
            .max()
            .unwrap_or_default();
        let wall_s = end.saturating_sub(start).as_secs_f64();
        let output_tokens: u64 = ok.iter().map(|r| u64::from(r.tokens)).sum();
        Self {
            requests: records.len(),
            errors: records.len() - ok.len(),
            error_samples,
            output_tokens,
            wall_s,
            output_tok_per_s: if wall_s > 0.0 {
                output_tokens as f64 / wall_s
            } else {
                0.0
            },
            ttft_ms: Dist::of(ok.iter().filter_map(|r| r.ttft()).map(ms).collect()),
            itl_ms: Dist::of(ok.iter().flat_map(|r| r.gaps()).map(ms).collect()),
            tpot_ms: Dist::of(ok.iter().filter_map(|r| r.tpot()).map(ms).collect()),
            cached_tokens: ok.iter().map(|r| u64::from(r.cached_tokens)).sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        assert_eq!(percentile(&v, 50.0), Some(5.5));
        assert!((percentile(&v, 99.0).unwrap_or(0.0) - 9.91).abs() < 1e-12);
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 100.0), Some(10.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        let d = Dist::of(vec![3.0, 1.0, 2.0, f64::NAN]);
        assert_eq!((d.n, d.p50, d.min, d.max, d.mean), (3, 2.0, 1.0, 3.0, 2.0));
    }

    #[test]
    fn summary_of_records() {
        let ms = Duration::from_millis;
        let mut a = Record::new(ms(0));
        a.events = vec![(ms(100), 1), (ms(110), 1), (ms(130), 2)];
        a.tokens = 4;
        a.elapsed = ms(140);
        a.outcome = Outcome::Finished("length".into());
        let mut b = Record::new(ms(50));
        b.outcome = Outcome::Error("boom".into());
        b.elapsed = ms(10);
        let s = Summary::of(&[a.clone(), b]);
        assert_eq!((s.requests, s.errors, s.output_tokens), (2, 1, 4));
        assert_eq!(s.error_samples, vec!["boom".to_owned()]);
        assert!((s.wall_s - 0.14).abs() < 1e-9);
        assert_eq!(s.ttft_ms.p50, 100.0);
        assert_eq!(s.itl_ms.n, 2);
        assert_eq!(s.itl_ms.p50, 15.0);
        assert_eq!(a.tpot(), Some(ms(10)));
    }
}
