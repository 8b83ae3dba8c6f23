//! The README's walk-throughs, followed in order as a new user would,
//! against one fresh broker: every `$ ricochet …` command of the sections
//! in [`SECTIONS`] runs through `sh` exactly as written (the `ricochet`
//! binary first on the `PATH`, `RICOCHET_URL` pointing at the broker), and
//! what it prints (stdout and stderr, interleaved as on a terminal) must be
//! the README's output once what differs between runs is masked: times,
//! durations and generated consumer and producer names (see [`mask`]). So a
//! README command that stops working, or whose output changed, fails here.
//! The commands whose output the README shows from another moment than
//! "after the previous one" are run but not compared ([`NOT_COMPARED`]).

use std::process::Stdio;
use std::time::Duration;

use regex::Regex;
use ricochet_testkit::InProcessBroker;

const README: &str = include_str!("../../README.md");

/// The sections run, in the README's order.
const SECTIONS: [&str; 2] = ["Failure handling in five minutes", "Partitioned topics"];

/// Commands run without comparing their output, with why: the README shows
/// what they print while step 3's consumer is still running ("from another
/// terminal"), which a sequential run cannot reproduce.
const NOT_COMPARED: [(usize, &str); 1] = [(
    3,
    "the first `subscription stats`: taken while step 3 runs, from another terminal",
)];

/// One `$ command` of a console block and the lines the README shows after it.
#[derive(Debug)]
struct Step {
    section: &'static str,
    command: String,
    expected: Vec<String>,
}

/// The text of `## name` up to the next `## ` heading.
fn section(name: &str) -> &'static str {
    let start = README
        .find(&format!("\n## {name}\n"))
        .unwrap_or_else(|| panic!("the README has no section {name:?}"));
    let body = &README[start + 1..];
    let end = body[3..].find("\n## ").map_or(body.len(), |e| e + 3);
    &body[..end]
}

/// The commands of the ```` ```console ```` blocks of `name`, in order.
fn steps(name: &'static str) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    let mut in_block = false;
    let mut continued = false;
    for line in section(name).lines() {
        let bare = line.trim_start();
        if !in_block {
            in_block = bare == "```console";
            continue;
        }
        if bare.starts_with("```") {
            in_block = false;
            continue;
        }
        if continued {
            let step = out.last_mut().expect("a command being continued");
            step.command.push('\n');
            step.command.push_str(line);
            continued = line.ends_with('\\');
        } else if let Some(command) = line.strip_prefix("$ ") {
            out.push(Step {
                section: name,
                command: command.to_owned(),
                expected: Vec::new(),
            });
            continued = command.ends_with('\\');
        } else if let Some(step) = out.last_mut() {
            step.expected.push(line.to_owned());
        }
    }
    for step in &mut out {
        while step.expected.last().is_some_and(|l| l.trim().is_empty()) {
            step.expected.pop();
        }
    }
    assert!(!out.is_empty(), "no console commands in {name:?}");
    out
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
async fn run(url: &str, dir: &std::path::Path, command: &str) -> (Vec<String>, bool) {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_ricochet"))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_walk_throughs_work_as_written() {
    let broker = InProcessBroker::start().await;
    let url = broker.url();
    let dir = tempfile::tempdir().unwrap();
    let all: Vec<Step> = SECTIONS.into_iter().flat_map(steps).collect();
    assert!(all.len() >= 19, "{all:#?}");
    let mut failures = Vec::new();
    for (n, step) in all.iter().enumerate() {
        let (got, ok) = run(&url, dir.path(), &step.command).await;
        let refused = step.expected.iter().any(|l| l.starts_with("error: "));
        if !ok && !refused {
            failures.push(format!(
                "[{}] step {n} `{}` failed:\n{}",
                step.section,
                step.command,
                got.join("\n")
            ));
            continue;
        }
        if NOT_COMPARED.iter().any(|(i, _)| *i == n) {
            continue;
        }
        let (want, have) = (mask(&step.expected), mask(&got));
        if want != have {
            failures.push(format!(
                "[{}] step {n} `{}`:\n--- README\n{}\n--- printed\n{}",
                step.section,
                step.command,
                want.join("\n"),
                have.join("\n")
            ));
        }
    }
    for (i, why) in NOT_COMPARED {
        assert!(
            all[i].command.starts_with("ricochet subscription stats"),
            "NOT_COMPARED names step {i} ({why}), which is now `{}`",
            all[i].command
        );
    }
    assert!(
        failures.is_empty(),
        "the README's commands drifted:\n\n{}",
        failures.join("\n\n")
    );
}

/// The parser itself: commands, continuations, outputs with blank lines.
#[test]
fn console_blocks_parse_into_commands_and_outputs() {
    let partitioned = steps("Partitioned topics");
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
    let five = steps("Failure handling in five minutes");
    let get = five
        .iter()
        .find(|s| s.command.starts_with("ricochet message get"))
        .unwrap();
    assert!(get.expected.iter().any(|l| l.is_empty()), "{get:?}");
    assert_eq!(
        mask(&["next retry due:       2026-11-29T15:02:44.018Z (in 544ms)".to_owned()]),
        vec!["next retry due: <time> (in <duration>)"]
    );
}
