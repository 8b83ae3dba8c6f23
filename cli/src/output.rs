//! Rendering: the `--output` switch, aligned text tables and key/value
//! blocks for people, and JSON (one pretty document, or compact lines for
//! streams) for scripts. Every read command builds a serde view (see
//! [`crate::view`]) and hands it to one of these.

use std::io::Write;

use clap::ValueEnum;
use serde::Serialize;

use crate::error::Result;

/// `--output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns and key/value blocks.
    #[default]
    Table,
    /// JSON.
    Json,
}

/// An aligned text table.
#[derive(Debug, Clone)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
    right: Vec<bool>,
}

impl Table {
    /// A table with these column headers; a header starting with `>` is
    /// right-aligned (numbers), without the `>`.
    pub fn new(headers: &[&str]) -> Self {
        Self {
            right: headers.iter().map(|h| h.starts_with('>')).collect(),
            headers: headers
                .iter()
                .map(|h| h.trim_start_matches('>').to_owned())
                .collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells are empty).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Whether no row was added.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Writes the table; the last column is not padded.
    pub fn write(&self, out: &mut dyn Write) -> Result<()> {
        let n = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cells: &[String], out: &mut dyn Write| -> Result<()> {
            let mut s = String::new();
            for (i, (&width, &right)) in widths.iter().zip(&self.right).enumerate() {
                let c = cells.get(i).map_or("", String::as_str);
                let pad = width.saturating_sub(c.chars().count());
                if i > 0 {
                    s.push_str("  ");
                }
                if right {
                    s.extend(std::iter::repeat_n(' ', pad));
                    s.push_str(c);
                } else {
                    s.push_str(c);
                    if i + 1 < n {
                        s.extend(std::iter::repeat_n(' ', pad));
                    }
                }
            }
            writeln!(out, "{}", s.trim_end())?;
            Ok(())
        };
        line(&self.headers, out)?;
        for r in &self.rows {
            line(r, out)?;
        }
        Ok(())
    }
}

/// `key: value` lines with the keys aligned.
#[derive(Debug, Clone, Default)]
pub struct Block {
    pairs: Vec<(String, String)>,
}

impl Block {
    /// An empty block.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a line.
    pub fn kv(&mut self, key: &str, value: impl ToString) -> &mut Self {
        self.pairs.push((key.to_owned(), value.to_string()));
        self
    }

    /// Appends the lines of `other`.
    pub fn extend(&mut self, other: Block) -> &mut Self {
        self.pairs.extend(other.pairs);
        self
    }

    /// Writes the block, indented by `indent` spaces.
    pub fn write(&self, out: &mut dyn Write, indent: usize) -> Result<()> {
        let w = self.pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
        for (k, v) in &self.pairs {
            let key = format!("{k}:");
            writeln!(out, "{:indent$}{key:<w$} {v}", "")?;
        }
        Ok(())
    }
}

/// Writes `value` as pretty JSON and a newline.
pub fn write_json(out: &mut dyn Write, value: &impl Serialize) -> Result<()> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    writeln!(out)?;
    Ok(())
}

/// Writes `value` as one compact JSON line and flushes (for streams).
pub fn write_json_line(out: &mut dyn Write, value: &impl Serialize) -> Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    writeln!(out)?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_alignment() {
        let mut t = Table::new(&["name", ">count", "note"]);
        t.row(vec!["a".into(), "5".into(), "x".into()]);
        t.row(vec!["longer".into(), "1234".into(), String::new()]);
        let mut buf = Vec::new();
        t.write(&mut buf).expect("write");
        assert_eq!(
            String::from_utf8(buf).expect("utf8"),
            "name    count  note\na           5  x\nlonger   1234\n"
        );
    }
}
