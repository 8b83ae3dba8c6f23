//! Redelivery lateness: an HDR histogram of how late deliveries came after
//! their due time, with a count of early ones (which must not happen), and
//! the one-line summary every lateness part prints.

use hdrhistogram::Histogram;

/// Lateness in microseconds, with the count of early (negative) ones.
pub(crate) struct Lateness {
    hist: Histogram<u64>,
    early: u64,
    worst_early_us: u64,
}

impl Lateness {
    pub(crate) fn new() -> Self {
        Self {
            hist: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds"),
            early: 0,
            worst_early_us: 0,
        }
    }

    /// Records a delivery at `at_us` of something due at `due_ms`.
    pub(crate) fn record(&mut self, at_us: u64, due_ms: u64) {
        let due_us = due_ms * 1000;
        if at_us < due_us {
            self.early += 1;
            self.worst_early_us = self.worst_early_us.max(due_us - at_us);
        } else {
            self.hist.saturating_record((at_us - due_us).max(1));
        }
    }

    pub(crate) fn print(&self, label: &str) {
        let ms = |q: f64| self.hist.value_at_quantile(q) as f64 / 1000.0;
        println!(
            "  {label}: n={} p50={:.2} ms p99={:.2} ms p99.9={:.2} ms max={:.2} ms early={}{}",
            self.hist.len() + self.early,
            ms(0.5),
            ms(0.99),
            ms(0.999),
            self.hist.max() as f64 / 1000.0,
            self.early,
            if self.early > 0 {
                format!(" (worst {} us early)", self.worst_early_us)
            } else {
                String::new()
            }
        );
    }
}
