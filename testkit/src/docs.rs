//! The project's documentation as its tests read it: `README.md` and the
//! book's pages (`docs/src/*.md`), parsed with pulldown-cmark into fenced
//! code blocks (so tests can run the commands and parse the config a page
//! shows), links and heading anchors (so a test can check that every
//! relative link and `#anchor` resolves). Read from the source tree at run
//! time, so a page added later is covered without a change here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};

/// The repository's root directory (the workspace this crate is part of).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit lives in the workspace")
        .to_owned()
}

/// One Markdown page: its path relative to the repository root and its text.
#[derive(Debug, Clone)]
pub struct Page {
    /// `README.md`, `docs/src/tour.md`, …
    pub path: PathBuf,
    /// The page's Markdown.
    pub text: String,
}

/// A fenced code block of a page.
#[derive(Debug, Clone)]
pub struct CodeBlock {
    /// The info string's first word (`console`, `toml`, `sh`…), or "".
    pub lang: String,
    /// The block's text, its fence's indentation removed.
    pub text: String,
    /// The line of its opening fence (1-based).
    pub line: usize,
}

/// A link or an image of a page, as written.
#[derive(Debug, Clone)]
pub struct Link {
    /// The destination (`tour.md`, `#retention`, `../../ARCHITECTURE.md#x`).
    pub dest: String,
    /// Its line (1-based).
    pub line: usize,
}

/// The README and the book's pages (sorted by name), read from disk.
pub fn pages() -> Vec<Page> {
    let root = repo_root();
    let mut paths = vec![PathBuf::from("README.md")];
    let book = root.join("docs/src");
    let mut book_pages: Vec<PathBuf> = std::fs::read_dir(&book)
        .unwrap_or_else(|e| panic!("read {}: {e}", book.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| p.strip_prefix(&root).expect("under the root").to_owned())
        .collect();
    book_pages.sort();
    paths.extend(book_pages);
    paths.into_iter().map(|path| page(&path)).collect()
}

/// The page at `path` (relative to the repository root).
pub fn page(path: &Path) -> Page {
    let full = repo_root().join(path);
    let text =
        std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("read {}: {e}", full.display()));
    Page {
        path: path.to_owned(),
        text,
    }
}

fn parser(text: &str) -> impl Iterator<Item = (Event<'_>, std::ops::Range<usize>)> {
    Parser::new_ext(text, Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH).into_offset_iter()
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset].bytes().filter(|&b| b == b'\n').count() + 1
}

impl Page {
    /// The page's fenced code blocks, in order.
    pub fn code_blocks(&self) -> Vec<CodeBlock> {
        let mut out = Vec::new();
        let mut open: Option<CodeBlock> = None;
        for (event, range) in parser(&self.text) {
            match event {
                Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(info))) => {
                    open = Some(CodeBlock {
                        lang: info.split_whitespace().next().unwrap_or("").to_owned(),
                        text: String::new(),
                        line: line_of(&self.text, range.start),
                    });
                }
                Event::Text(text) => {
                    if let Some(block) = open.as_mut() {
                        block.text.push_str(&text);
                    }
                }
                Event::End(TagEnd::CodeBlock) => out.extend(open.take()),
                _ => {}
            }
        }
        out
    }

    /// The page's links and images, code spans and blocks excluded.
    pub fn links(&self) -> Vec<Link> {
        parser(&self.text)
            .filter_map(|(event, range)| match event {
                Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                    Some(Link {
                        dest: dest_url.into_string(),
                        line: line_of(&self.text, range.start),
                    })
                }
                _ => None,
            })
            .collect()
    }

    /// The anchors its headings get (`## Disk full` → `disk-full`), with
    /// those of the files it includes (`{{#include PATH}}`, mdBook's).
    pub fn anchors(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let mut heading: Option<String> = None;
        for (event, _) in parser(&self.text) {
            match event {
                Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
                Event::Text(t) | Event::Code(t) => {
                    if let Some(h) = heading.as_mut() {
                        h.push_str(&t);
                    }
                }
                Event::End(TagEnd::Heading(_)) => {
                    out.extend(heading.take().map(|h| slug(&h)));
                }
                _ => {}
            }
        }
        let dir = self.path.parent().unwrap_or(Path::new(""));
        for line in self.text.lines() {
            if let Some(included) = line
                .trim()
                .strip_prefix("{{#include ")
                .and_then(|rest| rest.strip_suffix("}}"))
            {
                out.extend(page(&normalize(&dir.join(included.trim()))).anchors());
            }
        }
        out
    }
}

/// The anchor mdBook and GitHub give a heading: lower case, spaces to
/// `-`, everything but letters, digits, `-` and `_` dropped.
pub fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_lowercase().next()?),
            c if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

/// `a/b/../c` → `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Every relative link of `pages` that does not resolve, one line each
/// (`docs/src/x.md:12: retention.md#nope: no heading …`): its file must
/// exist (relative to the page), and its `#anchor`, on a Markdown page, must
/// be one of that page's headings. Links with a scheme (`https:`, `mailto:`)
/// are not checked.
pub fn broken_links(pages: &[Page]) -> Vec<String> {
    let root = repo_root();
    let mut broken = Vec::new();
    for page in pages {
        let dir = page.path.parent().unwrap_or(Path::new(""));
        for link in page.links() {
            if link.dest.contains("://") || link.dest.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match link.dest.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (link.dest.as_str(), None),
            };
            let at = format!("{}:{}: {}", page.path.display(), link.line, link.dest);
            let target = normalize(&dir.join(file));
            let anchors = if file.is_empty() {
                page.anchors()
            } else if target.starts_with("..") || !root.join(&target).exists() {
                broken.push(format!("{at}: no file {}", target.display()));
                continue;
            } else if anchor.is_none() {
                continue;
            } else if target.extension().is_none_or(|e| e != "md") {
                broken.push(format!("{at}: an anchor into a file that is not Markdown"));
                continue;
            } else {
                self::page(&target).anchors()
            };
            if let Some(anchor) = anchor.filter(|a| !anchors.contains(*a)) {
                let target = if file.is_empty() { &page.path } else { &target };
                broken.push(format!(
                    "{at}: no heading #{anchor} in {}",
                    target.display()
                ));
            }
        }
    }
    broken
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(path: &str, text: &str) -> Page {
        Page {
            path: PathBuf::from(path),
            text: text.to_owned(),
        }
    }

    #[test]
    fn slugs_follow_mdbook() {
        assert_eq!(slug("Disk full"), "disk-full");
        assert_eq!(
            slug("Integrity and `ricochet-broker check`"),
            "integrity-and-ricochet-broker-check"
        );
        assert_eq!(slug("Cluster: clients and CLI"), "cluster-clients-and-cli");
    }

    #[test]
    fn blocks_links_and_anchors_come_from_markdown_not_from_code() {
        let p = at(
            "docs/src/x.md",
            "# Title\n\nSee [a](y.md#b) and `[not](a-link.md)`.\n\n- item\n\n  ```console\n  $ ricochet x\n  out\n  ```\n\n## Sub `code`\n",
        );
        let blocks = p.code_blocks();
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks[0].lang, "console");
        assert_eq!(blocks[0].text, "$ ricochet x\nout\n");
        assert_eq!(blocks[0].line, 7);
        let links: Vec<String> = p.links().into_iter().map(|l| l.dest).collect();
        assert_eq!(links, ["y.md#b"]);
        assert_eq!(
            p.anchors().into_iter().collect::<Vec<_>>(),
            ["sub-code", "title"]
        );
    }

    #[test]
    fn a_broken_file_or_anchor_is_reported_and_a_good_one_is_not() {
        let good = at(
            "docs/src/x.md",
            "[ok](tour.md) [ok](tour.md#failure-handling-in-five-minutes) [ok](../../README.md#set-up-on-a-fresh-machine) [ok](#top)\n\n# Top\n",
        );
        assert_eq!(broken_links(&[good]), Vec::<String>::new());
        let bad = at(
            "docs/src/x.md",
            "[a](nope.md)\n[b](tour.md#no-such-heading)\n[c](#missing)\n[d](../../../etc/passwd)\n",
        );
        let found = broken_links(&[bad]);
        assert_eq!(found.len(), 4, "{found:#?}");
        assert!(found[0].starts_with("docs/src/x.md:1: nope.md: no file"));
        assert!(found[1].contains("no heading #no-such-heading in docs/src/tour.md"));
        assert!(found[2].starts_with("docs/src/x.md:3: #missing: no heading"));
        assert!(found[3].contains("no file"));
    }
}
