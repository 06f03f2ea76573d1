//! Per-tenant quota arithmetic, free of I/O and clocks (every call takes
//! `now`), so that it is tested exactly: requests per minute and per day,
//! tokens per minute (prompt + completion) and concurrent requests.
//!
//! Windows are fixed: one opens at a tenant's first request after the last
//! one closed and lasts its length (60 s, 86 400 s); the reset time the
//! headers report is when it closes. Tokens are reserved at admission (the
//! request's prompt plus its maximum completion) and settled to the real
//! count when the request ends: while in flight, a reservation counts
//! against whichever window is open, and the settled count goes to the
//! window open when the request ends. A request is admitted only when its
//! reservation fits beside what is used and reserved, so the window's
//! total never passes the limit.

use std::time::{Duration, Instant};

/// One tenant's limits (None: unlimited).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub requests_per_minute: Option<u64>,
    pub requests_per_day: Option<u64>,
    pub tokens_per_minute: Option<u64>,
    pub max_concurrent: Option<u64>,
}

impl Limits {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.requests_per_minute.is_some()
            || self.requests_per_day.is_some()
            || self.tokens_per_minute.is_some()
            || self.max_concurrent.is_some()
    }
}

pub const MINUTE: Duration = Duration::from_secs(60);
pub const DAY: Duration = Duration::from_secs(86_400);

/// A fixed window: what was counted since it opened.
#[derive(Clone, Copy, Debug)]
struct Window {
    len: Duration,
    opened: Option<Instant>,
    used: u64,
}

impl Window {
    const fn new(len: Duration) -> Self {
        Self {
            len,
            opened: None,
            used: 0,
        }
    }

    /// Closes the window if its time is over.
    fn roll(&mut self, now: Instant) {
        if self
            .opened
            .is_some_and(|o| now.saturating_duration_since(o) >= self.len)
        {
            self.opened = None;
            self.used = 0;
        }
    }

    /// Counts `n`, opening the window if none is open.
    fn add(&mut self, now: Instant, n: u64) {
        self.roll(now);
        self.opened.get_or_insert(now);
        self.used = self.used.saturating_add(n);
    }

    /// Time until the open window closes (its full length if none is open).
    fn reset_in(&self, now: Instant) -> Duration {
        match self.opened {
            Some(o) => (o + self.len).saturating_duration_since(now),
            None => self.len,
        }
    }
}

/// Which limit refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    RequestsPerMinute,
    RequestsPerDay,
    TokensPerMinute,
    Concurrent,
}

impl Limit {
    /// The name used in messages, logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RequestsPerMinute => "requests_per_minute",
            Self::RequestsPerDay => "requests_per_day",
            Self::TokensPerMinute => "tokens_per_minute",
            Self::Concurrent => "max_concurrent",
        }
    }
}

/// What the rate-limit headers report after an admission or a refusal:
/// the binding request window (per minute when set, else per day) and the
/// token window, each as (limit, remaining, reset in).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub requests: Option<(u64, u64, Duration)>,
    pub tokens: Option<(u64, u64, Duration)>,
}

/// A refusal: the limit, and when a retry may succeed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub limit: Limit,
    pub retry_after: Duration,
    /// The request's own token reservation, for the message.
    pub reserve: u64,
    pub snapshot: Snapshot,
}

/// One tenant's counters.
#[derive(Clone, Debug)]
pub struct Quota {
    minute_requests: Window,
    day_requests: Window,
    minute_tokens: Window,
    /// Tokens reserved by requests in flight.
    reserved: u64,
    in_flight: u64,
}

impl Default for Quota {
    fn default() -> Self {
        Self {
            minute_requests: Window::new(MINUTE),
            day_requests: Window::new(DAY),
            minute_tokens: Window::new(MINUTE),
            reserved: 0,
            in_flight: 0,
        }
    }
}

impl Quota {
    /// Admits a request that may use up to `reserve` tokens, counting it
    /// and reserving them, or refuses it (changing nothing).
    pub fn admit(
        &mut self,
        now: Instant,
        limits: &Limits,
        reserve: u64,
    ) -> Result<Snapshot, Refusal> {
        self.minute_requests.roll(now);
        self.day_requests.roll(now);
        self.minute_tokens.roll(now);
        let refuse = |q: &Self, limit, retry_after| Refusal {
            limit,
            retry_after,
            reserve,
            snapshot: q.snapshot(now, limits),
        };
        if limits.max_concurrent.is_some_and(|m| self.in_flight >= m) {
            // Freed when a request ends, which cannot be foretold.
            return Err(refuse(self, Limit::Concurrent, Duration::from_secs(1)));
        }
        if limits
            .requests_per_minute
            .is_some_and(|m| self.minute_requests.used >= m)
        {
            let at = self.minute_requests.reset_in(now);
            return Err(refuse(self, Limit::RequestsPerMinute, at));
        }
        if limits
            .requests_per_day
            .is_some_and(|m| self.day_requests.used >= m)
        {
            let at = self.day_requests.reset_in(now);
            return Err(refuse(self, Limit::RequestsPerDay, at));
        }
        if let Some(m) = limits.tokens_per_minute {
            let taken = self.minute_tokens.used.saturating_add(self.reserved);
            if taken.saturating_add(reserve) > m {
                // Room may come from a settle or from the window's end.
                let at = self.minute_tokens.reset_in(now);
                return Err(refuse(self, Limit::TokensPerMinute, at));
            }
        }
        self.minute_requests.add(now, 1);
        self.day_requests.add(now, 1);
        // Opens the token window at the first request too.
        self.minute_tokens.add(now, 0);
        self.reserved = self.reserved.saturating_add(reserve);
        self.in_flight += 1;
        Ok(self.snapshot(now, limits))
    }

    /// Ends an admitted request that reserved `reserve` tokens and used
    /// `used`.
    pub fn settle(&mut self, now: Instant, reserve: u64, used: u64) {
        self.reserved = self.reserved.saturating_sub(reserve);
        self.in_flight = self.in_flight.saturating_sub(1);
        self.minute_tokens.add(now, used);
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// What the headers report now.
    pub fn snapshot(&self, now: Instant, limits: &Limits) -> Snapshot {
        let requests = match (limits.requests_per_minute, limits.requests_per_day) {
            (Some(m), _) => Some(self.view(&self.minute_requests, m, 0, now)),
            (None, Some(d)) => Some(self.view(&self.day_requests, d, 0, now)),
            (None, None) => None,
        };
        let tokens = limits
            .tokens_per_minute
            .map(|m| self.view(&self.minute_tokens, m, self.reserved, now));
        Snapshot { requests, tokens }
    }

    fn view(&self, w: &Window, limit: u64, extra: u64, now: Instant) -> (u64, u64, Duration) {
        let mut w = *w;
        w.roll(now);
        let taken = w.used.saturating_add(extra);
        (limit, limit.saturating_sub(taken), w.reset_in(now))
    }
}

/// A reset time as OpenAI writes it: `1m30s`, `12s`, `250ms`.
pub fn format_reset(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    // Whole seconds, rounded up: a client waiting this long finds it reset.
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
#[path = "quota_tests.rs"]
mod tests;
