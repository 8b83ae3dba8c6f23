//! The subscription page's pictures, as inline SVG drawn with maud (so every
//! label is escaped like the rest of the page): the retry schedule by due
//! time (the admin API's `scheduled_by_due` buckets), and the dead-letter
//! inflow by reason over time, bucketed here from the dead letters' reasons
//! and dead-lettering times ([`Inflow`]). Each bar carries a `<title>`, the
//! browser's own tooltip; no script.

use super::format::fmt_ms;
use maud::{Markup, html};
use ricochet_proto::DueBucket;

const W: u64 = 560;
const H: u64 = 220;
const LEFT: u64 = 44;
const BOTTOM: u64 = 40;
const TOP: u64 = 14;
/// Most reasons drawn apart; the rest are summed as "other".
const MAX_REASONS: usize = 5;
/// Most time buckets the inflow aims for.
const MAX_BUCKETS: u64 = 24;
/// Fewest buckets the inflow's axis spans.
const MIN_SLOTS: u64 = 12;
const PALETTE: [&str; 6] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#9a9a9a",
];
/// The bucket widths the inflow chooses from (ms): the smallest that fits
/// the span in [`MAX_BUCKETS`] buckets.
const STEPS_MS: [u64; 10] = [
    60_000,
    300_000,
    900_000,
    3_600_000,
    3 * 3_600_000,
    6 * 3_600_000,
    12 * 3_600_000,
    86_400_000,
    7 * 86_400_000,
    30 * 86_400_000,
];

fn plot_height() -> u64 {
    H - BOTTOM - TOP
}

/// Bar height for `count` on a scale topped by `max`.
fn scaled(count: u64, max: u64) -> u64 {
    (count * plot_height()).checked_div(max).unwrap_or(0)
}

fn axes(max: u64) -> Markup {
    let base = H - BOTTOM;
    html! {
        line x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(base) stroke="#888" {}
        line x1=(LEFT) y1=(base) x2=(W - 4) y2=(base) stroke="#888" {}
        text x=(LEFT - 6) y=(TOP + 4) text-anchor="end" font-size="11" { (max) }
        text x=(LEFT - 6) y=(base) text-anchor="end" font-size="11" { "0" }
    }
}

/// Scheduled retries per due-time bucket, as bars.
pub(crate) fn retry_schedule(buckets: &[DueBucket]) -> Markup {
    let max = buckets.iter().map(|b| b.count).max().unwrap_or(0);
    let n = buckets.len().max(1) as u64;
    let slot = (W - LEFT - 8) / n;
    let base = H - BOTTOM;
    html! {
        svg.chart #retry-schedule xmlns="http://www.w3.org/2000/svg" width=(W) height=(H)
            viewBox=(format!("0 0 {W} {H}")) role="img" aria-label="Scheduled retries by due time" {
            (axes(max))
            @for (i, b) in buckets.iter().enumerate() {
                @let x = LEFT + 4 + i as u64 * slot;
                @let h = scaled(b.count, max);
                rect x=(x) y=(base - h) width=(slot.saturating_sub(6).max(2)) height=(h) fill=(PALETTE[0]) {
                    title { (b.label) ": " (b.count) " scheduled" }
                }
                text x=(x + slot / 2) y=(base - h - 3) text-anchor="middle" font-size="11" { (b.count) }
                text x=(x + slot / 2) y=(base + 14) text-anchor="middle" font-size="11" { (b.label) }
            }
            text x=(LEFT) y=(H - 6) font-size="11" fill="#555" { "due within" }
        }
    }
}

/// Dead letters per time bucket and reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inflow {
    /// Bucket width, ms.
    pub step_ms: u64,
    /// Start of the first bucket, ms since epoch.
    pub start_ms: u64,
    /// Legend order: the most frequent reasons first, then `other` if any.
    pub reasons: Vec<String>,
    /// `counts[bucket][reason]`, indexes as in `reasons`.
    pub counts: Vec<Vec<u64>>,
}

impl Inflow {
    /// Buckets `(dead-lettered at ms, reason)` pairs over the time from
    /// the first of them to `now_ms` (so a quiet spell since shows as one);
    /// `None` when there are none.
    pub(crate) fn from_points(points: &[(u64, &str)], now_ms: u64) -> Option<Self> {
        let min = points.iter().map(|p| p.0).min()?;
        let max = points.iter().map(|p| p.0).max()?.max(now_ms);
        let step_ms = STEPS_MS
            .iter()
            .copied()
            .find(|s| max / s - min / s < MAX_BUCKETS)
            .unwrap_or(STEPS_MS[STEPS_MS.len() - 1]);
        // At least MIN_SLOTS buckets, ending with now's: a short history is
        // drawn as narrow bars leading up to now, not one bar across.
        let last = max / step_ms;
        let first = (min / step_ms).min(last.saturating_sub(MIN_SLOTS - 1));
        let start_ms = first * step_ms;
        let buckets = (last - first + 1) as usize;
        let mut by_reason: Vec<(&str, u64)> = Vec::new();
        for (_, r) in points {
            match by_reason.iter_mut().find(|(name, _)| name == r) {
                Some((_, n)) => *n += 1,
                None => by_reason.push((r, 1)),
            }
        }
        by_reason.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let mut reasons: Vec<String> = by_reason
            .iter()
            .take(MAX_REASONS)
            .map(|(r, _)| (*r).to_owned())
            .collect();
        let has_other = by_reason.len() > MAX_REASONS;
        if has_other {
            reasons.push("other".to_owned());
        }
        let mut counts = vec![vec![0u64; reasons.len()]; buckets];
        for (at, r) in points {
            let b = ((at - start_ms) / step_ms) as usize;
            let k = reasons[..reasons.len() - usize::from(has_other)]
                .iter()
                .position(|x| x == r)
                .unwrap_or(reasons.len() - 1);
            counts[b][k] += 1;
        }
        Some(Self {
            step_ms,
            start_ms,
            reasons,
            counts,
        })
    }
}

/// One stacked segment of the inflow chart.
struct Bar {
    x: u64,
    y: u64,
    h: u64,
    colour: &'static str,
    tip: String,
}

/// The inflow as stacked bars, one colour per reason, with a legend.
pub(crate) fn inflow_chart(inflow: &Inflow) -> Markup {
    let max = inflow
        .counts
        .iter()
        .map(|c| c.iter().sum::<u64>())
        .max()
        .unwrap_or(0);
    let n = (inflow.counts.len() as u64).max(1);
    let slot = ((W - LEFT - 8) / n).max(1);
    let base = H - BOTTOM;
    let end_ms = inflow.start_ms + n * inflow.step_ms;
    let step = humantime::format_duration(std::time::Duration::from_millis(inflow.step_ms));
    let mut bars = Vec::new();
    for (i, bucket) in inflow.counts.iter().enumerate() {
        let x = LEFT + 4 + i as u64 * slot;
        let at = inflow.start_ms + i as u64 * inflow.step_ms;
        let mut y = base;
        for (k, &count) in bucket.iter().enumerate().filter(|(_, c)| **c > 0) {
            let h = scaled(count, max).max(1);
            y -= h;
            bars.push(Bar {
                x,
                y,
                h,
                colour: PALETTE[k.min(PALETTE.len() - 1)],
                tip: format!("{} + {step}: {count} × {}", fmt_ms(at), inflow.reasons[k]),
            });
        }
    }
    html! {
        svg.chart #dlq-inflow xmlns="http://www.w3.org/2000/svg" width=(W) height=(H)
            viewBox=(format!("0 0 {W} {H}")) role="img" aria-label="Dead letters by reason over time" {
            (axes(max))
            @for bar in &bars {
                rect x=(bar.x) y=(bar.y) width=(slot.saturating_sub(2).max(1)) height=(bar.h) fill=(bar.colour) {
                    title { (bar.tip) }
                }
            }
            text x=(LEFT) y=(base + 14) font-size="11" { (fmt_ms(inflow.start_ms)) }
            text x=(W - 4) y=(base + 14) text-anchor="end" font-size="11" { (fmt_ms(end_ms)) }
            text x=(LEFT) y=(H - 6) font-size="11" fill="#555" { "dead letters per " (step) }
        }
        p.legend {
            @for (k, r) in inflow.reasons.iter().enumerate() {
                span {
                    span.swatch style=(format!("background:{}", PALETTE[k.min(PALETTE.len() - 1)])) {}
                    (r)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inflow_picks_the_smallest_step_that_fits_and_sums_the_rare_reasons() {
        let t0 = 1_700_000_000_000u64;
        let mut points: Vec<(u64, &str)> = vec![
            (t0, "a"),
            (t0 + 1, "a"),
            (t0 + 2, "b"),
            (t0 + 30 * 60_000, "a"),
        ];
        let f = Inflow::from_points(&points, 0).unwrap();
        // 30 minutes fit in 24 buckets of 5 minutes, not of 1 minute.
        assert_eq!(f.step_ms, 300_000);
        assert_eq!(f.reasons, vec!["a", "b"]);
        // Seven buckets hold them; the axis shows twelve, ending with the last.
        assert_eq!(f.counts.len(), 12);
        assert_eq!(f.counts[5], vec![2, 1]);
        assert_eq!(f.counts[11], vec![1, 0]);
        assert_eq!(f.start_ms % f.step_ms, 0);
        for r in ["c", "d", "e", "f", "g"] {
            points.push((t0, r));
        }
        // Up to now: two hours need 15-minute buckets.
        let f = Inflow::from_points(&points, t0 + 2 * 3_600_000).unwrap();
        assert_eq!(f.step_ms, 900_000);
        assert_eq!(f.counts.len(), 12);
        assert_eq!(f.reasons.len(), MAX_REASONS + 1);
        assert_eq!(f.reasons.last().unwrap(), "other");
        let total: u64 = f.counts.iter().flatten().sum();
        assert_eq!(total, points.len() as u64);
        // "a" has 3, "b".."g" one each: the two past the top five are "other".
        let first = f.counts.iter().find(|c| c.iter().sum::<u64>() > 0).unwrap();
        assert_eq!(first[MAX_REASONS], 2);
        assert!(Inflow::from_points(&[], t0).is_none());
    }

    #[test]
    fn a_reason_with_markup_is_drawn_as_text() {
        let f = Inflow::from_points(&[(5, "<script>x</script>")], 5).unwrap();
        let svg = inflow_chart(&f).into_string();
        assert!(!svg.contains("<script>"), "{svg}");
        assert!(svg.contains("&lt;script&gt;"), "{svg}");
    }
}
