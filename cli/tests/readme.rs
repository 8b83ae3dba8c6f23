//! The README's and the book's walk-throughs, followed in order as a new
//! user would: for each page (`README.md`, `docs/src/*.md`) with a
//! ```` ```console ```` block, one fresh broker, and every `$ ricochet …`
//! command of the page runs through `sh` exactly as written (the `ricochet`
//! binary first on the `PATH`, `RICOCHET_URL` pointing at the broker), in
//! the page's order; what it prints (stdout and stderr, interleaved as on a
//! terminal) must be what the page shows once what differs between runs is
//! masked: times, durations and generated consumer and producer names (see
//! [`mask`]). So a documented command that stops working, or whose output
//! changed, fails here. Commands the page shows with only `…` as output
//! are run and must succeed. The pages that need more than one
//! standalone broker are not run ([`NOT_RUN`], with why), nor compared are
//! the commands whose output a page shows from another moment than "after
//! the previous one" ([`NOT_COMPARED`]). Console lines that are not a
//! `ricochet` command (`cargo run`, `etcd`, `export`) are not run here.
//!
//! The same pages' links are checked by `docs_links`.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use regex::Regex;
use ricochet_testkit::InProcessBroker;
use ricochet_testkit::docs::{self, Page};

/// Pages whose commands are not run, with why.
const NOT_RUN: [(&str, &str); 3] = [
    (
        "docs/src/security.md",
        "its commands need the TLS + token broker the page starts with openssl-made certificates; \
         cli/tests/it/auth.rs runs the same commands (token create, auth grant|whoami, refusals, \
         plaintext to a TLS port) against such a broker",
    ),
    (
        "docs/src/ordered-retries.md",
        "its commands set key order on a Key_Shared/Failover/Exclusive subscription a consumer \
         made first; cli/tests/it/key_order.rs runs `policy set --key-order [--poison-key-after]`, \
         `policy get` and `policy set --clear` against such a subscription",
    ),
    (
        "docs/src/cluster-clients.md",
        "its output is from a cluster of brokers on etcd (b1, b2, b3); cli/tests/it/cluster.rs \
         runs `cluster brokers|lookup|move|drain` against such a cluster \
         (cluster_move_and_drain_on_a_real_cluster) and checks their tables",
    ),
];

/// Commands run without comparing their output, with why: (page, the
/// command's index among the page's commands, how it starts, why).
const NOT_COMPARED: [(&str, usize, &str, &str); 4] = [
    (
        "docs/src/tour.md",
        3,
        "ricochet subscription stats",
        "the first `subscription stats`: taken while step 3 runs, from another terminal",
    ),
    (
        "docs/src/measuring.md",
        0,
        "ricochet perf produce",
        "a measurement: the figures differ with every run and machine",
    ),
    (
        "docs/src/measuring.md",
        1,
        "ricochet perf produce",
        "a measurement: the figures differ with every run and machine",
    ),
    (
        "docs/src/measuring.md",
        2,
        "ricochet perf redeliver",
        "a measurement: the figures differ with every run and machine",
    ),
];

/// One `$ command` of a console block and the lines the page shows after it.
#[derive(Debug)]
struct Step {
    command: String,
    expected: Vec<String>,
}

/// The `$ ricochet …` commands of `page`'s console blocks, in order.
fn steps(page: &Page) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    for block in page.code_blocks().iter().filter(|b| b.lang == "console") {
        // Output after a command that is not run belongs to nobody.
        let mut current: Option<Step> = None;
        let mut continued = false;
        for line in block.text.lines() {
            if continued {
                let step = current.as_mut().expect("a command being continued");
                step.command.push('\n');
                step.command.push_str(line);
                continued = line.ends_with('\\');
            } else if let Some(command) = line.strip_prefix("$ ") {
                out.extend(current.take().filter(|s| is_ricochet(&s.command)));
                current = Some(Step {
                    command: command.to_owned(),
                    expected: Vec::new(),
                });
                continued = command.ends_with('\\');
            } else if let Some(step) = current.as_mut() {
                step.expected.push(line.to_owned());
            }
        }
        out.extend(current.take().filter(|s| is_ricochet(&s.command)));
    }
    for step in &mut out {
        while step.expected.last().is_some_and(|l| l.trim().is_empty()) {
            step.expected.pop();
        }
    }
    out
}

/// A command of the `ricochet` CLI (not `ricochet-broker`, `cargo`…).
fn is_ricochet(command: &str) -> bool {
    command.starts_with("ricochet ")
}

/// `text`'s lines with what differs between runs masked and runs of spaces
/// (table padding) made one.
fn mask(text: &[String]) -> Vec<String> {
    let rules = [
        (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "<time>"),
        (r"\(in [^)]*\)", "(in <duration>)"),
        (r"consumer-[0-9a-f]{16}-\d+", "consumer-<id>"),
        (r"producer-[0-9a-f]{16}-\d+", "producer-<id>"),
        (r" +", " "),
    ]
    .map(|(re, with)| (Regex::new(re).unwrap(), with));
    text.iter()
        .map(|line| {
            let mut l = line.trim_end().to_owned();
            for (re, with) in &rules {
                l = re.replace_all(&l, *with).into_owned();
            }
            l
        })
        .collect()
}

/// Runs `command` through `sh` as a reader would type it; its output lines.
async fn run(url: &str, dir: &Path, command: &str) -> (Vec<String>, bool) {
    let bin = Path::new(env!("CARGO_BIN_EXE_ricochet"))
        .parent()
        .unwrap()
        .to_owned();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!("exec 2>&1\n{command}"))
        .current_dir(dir)
        .env("PATH", path)
        .env("RICOCHET_URL", url)
        .env_remove("RICOCHET_TOKEN")
        .env_remove("RICOCHET_TOKEN_FILE")
        .env_remove("RICOCHET_TLS_CA")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("sh");
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("`{command}` did not finish in 120 s"))
        .expect("its output");
    let text = String::from_utf8_lossy(&out.stdout);
    (
        text.lines().map(str::to_owned).collect(),
        out.status.success(),
    )
}

/// Follows one page against a fresh broker; what drifted, one entry each.
async fn follow(page: &Page, steps: &[Step]) -> Vec<String> {
    let broker = InProcessBroker::start().await;
    let url = broker.url();
    let dir = tempfile::tempdir().unwrap();
    let name = page.path.display().to_string();
    let mut failures = Vec::new();
    for (n, step) in steps.iter().enumerate() {
        let (got, ok) = run(&url, dir.path(), &step.command).await;
        let refused = step.expected.iter().any(|l| l.starts_with("error: "));
        if !ok && !refused {
            failures.push(format!(
                "[{name}] step {n} `{}` failed:\n{}",
                step.command,
                got.join("\n")
            ));
            continue;
        }
        let elided = step.expected == ["…"];
        if elided
            || NOT_COMPARED
                .iter()
                .any(|(p, i, _, _)| *p == name && *i == n)
        {
            continue;
        }
        let (want, have) = (mask(&step.expected), mask(&got));
        if want != have {
            failures.push(format!(
                "[{name}] step {n} `{}`:\n--- page\n{}\n--- printed\n{}",
                step.command,
                want.join("\n"),
                have.join("\n")
            ));
        }
    }
    failures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_command_works_as_written() {
    let pages = docs::pages();
    let mut failures = Vec::new();
    let mut followed = Vec::new();
    for page in &pages {
        let name = page.path.display().to_string();
        let steps = steps(page);
        if let Some((_, why)) = NOT_RUN.iter().find(|(p, _)| *p == name) {
            assert!(
                !steps.is_empty(),
                "NOT_RUN lists {name} ({why}), which has no `$ ricochet` command now"
            );
            continue;
        }
        if steps.is_empty() {
            continue;
        }
        for (p, i, start, why) in NOT_COMPARED.iter().filter(|(p, ..)| *p == name) {
            assert!(
                steps.get(*i).is_some_and(|s| s.command.starts_with(start)),
                "NOT_COMPARED names step {i} of {p} ({why}), which is now {:?}",
                steps.get(*i).map(|s| &s.command)
            );
        }
        followed.push(format!("{name} ({} commands)", steps.len()));
        failures.extend(follow(page, &steps).await);
    }
    for must in ["README.md", "docs/src/tour.md", "docs/src/retention.md"] {
        assert!(
            followed.iter().any(|f| f.starts_with(must)),
            "{must} was not followed: {followed:?}"
        );
    }
    eprintln!("followed: {}", followed.join(", "));
    assert!(
        failures.is_empty(),
        "the documented commands drifted:\n\n{}",
        failures.join("\n\n")
    );
}

/// Every relative link and `#anchor` of the README and the book resolves,
/// and every page of the book is in its `SUMMARY.md`.
#[test]
fn docs_links() {
    let pages = docs::pages();
    assert!(pages.len() >= 15, "{} pages", pages.len());
    let broken = docs::broken_links(&pages);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    // Every page of the book is a chapter of it.
    let summary = docs::page(Path::new("docs/src/SUMMARY.md"));
    let chapters: Vec<String> = summary.links().into_iter().map(|l| l.dest).collect();
    let orphans: Vec<String> = pages
        .iter()
        .filter(|p| p.path.starts_with("docs/src") && !p.path.ends_with("SUMMARY.md"))
        .map(|p| p.path.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|name| !chapters.contains(name))
        .collect();
    assert!(orphans.is_empty(), "pages not in SUMMARY.md: {orphans:?}");
}

/// The parser itself: commands, continuations, outputs with blank lines,
/// indented blocks, and commands that are not `ricochet`'s.
#[test]
fn console_blocks_parse_into_commands_and_outputs() {
    let partitioned = steps(&docs::page(Path::new("docs/src/partitioned-topics.md")));
    assert_eq!(
        partitioned
            .iter()
            .map(|s| s.command.as_str())
            .collect::<Vec<_>>(),
        vec![
            "ricochet topics create shipments --partitions 8",
            "ricochet topics update-partitions shipments 12",
            "ricochet topics update-partitions shipments 4",
        ]
    );
    assert_eq!(partitioned[1].expected.len(), 1);
    let tour = steps(&docs::page(Path::new("docs/src/tour.md")));
    let get = tour
        .iter()
        .find(|s| s.command.starts_with("ricochet message get"))
        .unwrap();
    assert!(get.expected.iter().any(|l| l.is_empty()), "{get:?}");
    // The retention page's backlog-quota block sits in a list item.
    let retention = steps(&docs::page(Path::new("docs/src/retention.md")));
    assert!(
        retention
            .iter()
            .any(|s| s.command.contains("--quota-action drop-oldest")),
        "{retention:#?}"
    );
    // The console page's broker start is not a `ricochet` command.
    let console = steps(&docs::page(Path::new("docs/src/console.md")));
    assert!(console.is_empty(), "{console:#?}");
    assert_eq!(
        mask(&["next retry due:       2026-11-29T15:02:44.018Z (in 544ms)".to_owned()]),
        vec!["next retry due: <time> (in <duration>)"]
    );
}
