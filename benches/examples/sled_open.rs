//! Times sled's own open (its recovery) on a broker's data directory, apart
//! from the broker: `sled::Config::open` with the broker's settings, opening
//! every tree, and (optionally) counting the keys of named trees, then the
//! process's resident memory. Run it on a copy of a stopped broker's store
//! (opening writes a sled snapshot):
//! `cargo run --release -p ricochet-benches --example sled_open -- DIR [CACHE_BYTES] [TREE...]`
//! (e.g. `schedule`, the tree a scheduled retry's entry lives in).

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or("usage: sled_open DIR [CACHE_BYTES] [TREE...]")?;
    let cache: u64 = match args.next() {
        Some(c) => c.parse()?,
        None => 16 << 20,
    };
    let count: Vec<String> = args.collect();
    let t = Instant::now();
    let db = sled::Config::new()
        .path(&dir)
        .cache_capacity(cache)
        .flush_every_ms(None)
        .open()?;
    let open = t.elapsed();
    let t = Instant::now();
    let names = db.tree_names();
    for n in &names {
        db.open_tree(n)?;
    }
    println!(
        "sled::Config::open {:.3} s; {} trees opened in {:.3} s",
        open.as_secs_f64(),
        names.len(),
        t.elapsed().as_secs_f64()
    );
    for name in count {
        let t = Instant::now();
        let mut n = 0u64;
        for k in db.open_tree(&name)?.iter().keys() {
            k?;
            n += 1;
        }
        println!(
            "counted {n} keys of {name} in {:.3} s",
            t.elapsed().as_secs_f64()
        );
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    for l in status
        .lines()
        .filter(|l| l.starts_with("VmRSS") || l.starts_with("VmHWM"))
    {
        println!("{l}");
    }
    Ok(())
}
