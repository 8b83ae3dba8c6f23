//! Where a new topic goes: the pure choice behind `placement/<topic>`. A
//! topic is placed on the live broker with the fewest placed topics, then
//! the lowest reported load, then the smallest id (so every broker makes
//! the same choice from the same view); the partitions of a new
//! partitioned topic are placed one after another, each choice counting
//! the ones before it, so they spread over the live brokers. The choice is
//! written once by a "create if absent" transaction (`Cluster::place`), and
//! never changes afterwards: placement is sticky, the data lives there.

use std::collections::HashMap;

/// A live broker as placement sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Its id.
    pub id: String,
    /// Its reported load (messages per second published).
    pub load: f64,
}

/// The broker for one new topic, given how many topics each broker holds
/// (`placed`, by id; brokers missing from it hold none). `None` when no
/// broker is live.
pub fn choose(live: &[Candidate], placed: &HashMap<String, u64>) -> Option<String> {
    live.iter()
        .min_by(|a, b| {
            let count = |c: &Candidate| placed.get(&c.id).copied().unwrap_or(0);
            count(a)
                .cmp(&count(b))
                .then(a.load.total_cmp(&b.load))
                .then(a.id.cmp(&b.id))
        })
        .map(|c| c.id.clone())
}

/// The brokers for `n` new topics placed together (the partitions of a new
/// partitioned topic), each choice counted before the next.
pub fn spread(live: &[Candidate], placed: &HashMap<String, u64>, n: usize) -> Vec<String> {
    let mut placed = placed.clone();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let Some(id) = choose(live, &placed) else {
            break;
        };
        *placed.entry(id.clone()).or_default() += 1;
        out.push(id);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(loads: &[(&str, f64)]) -> Vec<Candidate> {
        loads
            .iter()
            .map(|(id, load)| Candidate {
                id: (*id).into(),
                load: *load,
            })
            .collect()
    }

    #[test]
    fn the_fewest_placed_wins_then_the_lowest_load_then_the_id() {
        let brokers = live(&[("a", 5.0), ("b", 1.0), ("c", 1.0)]);
        let mut placed = HashMap::new();
        assert_eq!(choose(&brokers, &placed).as_deref(), Some("b"));
        placed.insert("b".to_owned(), 1);
        assert_eq!(choose(&brokers, &placed).as_deref(), Some("c"));
        placed.insert("c".to_owned(), 1);
        assert_eq!(choose(&brokers, &placed).as_deref(), Some("a"));
        // A dead broker's placements do not make a live one look busy.
        placed.insert("dead".to_owned(), 0);
        assert_eq!(choose(&[], &placed), None);
    }

    #[test]
    fn partitions_spread_evenly_over_the_live_brokers() {
        let brokers = live(&[("a", 0.0), ("b", 0.0), ("c", 0.0)]);
        let got = spread(&brokers, &HashMap::new(), 8);
        let count = |id: &str| got.iter().filter(|g| *g == id).count();
        assert_eq!((count("a"), count("b"), count("c")), (3, 3, 2), "{got:?}");
        // Around an existing imbalance: the emptier broker catches up first.
        let placed = HashMap::from([("a".to_owned(), 4)]);
        let got = spread(&brokers, &placed, 4);
        assert!(!got.contains(&"a".to_owned()), "{got:?}");
        assert!(spread(&[], &placed, 3).is_empty());
    }
}
