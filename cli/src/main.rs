//! `ricochet`: the operator command line of the Ricochet broker. Parses the
//! arguments (clap exits with 2 on a usage error), runs the command from the
//! `ricochet_cli` library on a tokio runtime, and reports a failure as one
//! line `error: …` on stderr with exit code 1 (2 for usage errors).

use std::process::ExitCode;

use clap::Parser;
use ricochet_cli::{Cli, CliError, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let mut stdout = std::io::stdout();
    let result = runtime.block_on(run(cli, &mut stdout));
    // Background tasks (client streams) must not keep the process alive.
    runtime.shutdown_background();
    match result {
        Ok(()) | Err(CliError::BrokenPipe) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", e.one_line());
            ExitCode::from(e.exit_code())
        }
    }
}
