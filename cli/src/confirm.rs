//! Confirmation of destructive commands (`dlq replay`, `dlq purge`,
//! `topics delete`, `subscriptions delete`): `--yes` skips the question;
//! otherwise the question is asked on stderr and answered on a terminal.
//! Without a terminal on stdin and without `--yes` the command refuses,
//! so a script never blocks on, or silently answers, a prompt.

use std::io::{BufRead, IsTerminal, Write};

use crate::error::{CliError, Result};

/// Asks `question` (a phrase like "purge 3 dead letters of …") unless `yes`.
pub fn confirm(question: &str, yes: bool) -> Result<()> {
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(CliError::Usage(format!(
            "refusing to {question} without confirmation: stdin is not a terminal; pass --yes to confirm"
        )));
    }
    let mut err = std::io::stderr();
    write!(err, "{}? [y/N] ", capitalise(question))?;
    err.flush()?;
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(CliError::Other("aborted: nothing was changed".to_owned())),
    }
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn yes_skips_the_question() {
        super::confirm("purge everything", true).expect("--yes");
        assert_eq!(super::capitalise("purge x"), "Purge x");
    }
}
