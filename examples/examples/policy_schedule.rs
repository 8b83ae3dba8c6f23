//! Prints the retry schedule of both built-in dead-letter policies at their
//! defaults: RocketMQ's delay levels (16 retries, 10 s … 2 h, through the
//! retry tier, then the DLQ) and Pulsar's multiplier backoff (10 s, 20 s,
//! 40 s … capped at 10 min), and any extra policies given on the command line
//! in the compact form, e.g.
//!
//! ```text
//! cargo run -p ricochet-examples --example policy_schedule -- "backoff:fixed=30s,max=5"
//! ```

use std::process::ExitCode;

use ricochet_policy::{
    BackoffPolicy, DeadLetterPolicy, DelayLevelPolicy, FailureReason, PolicySpec, explain_table,
};

fn main() -> ExitCode {
    println!("RocketMQ delay levels (defaults), for reconsume_later:\n");
    println!(
        "{}",
        explain_table(&DelayLevelPolicy::default(), FailureReason::ReconsumeLater)
    );

    // Pulsar's MultiplierRedeliveryBackoff defaults; Pulsar has no default
    // redelivery count, so take RocketMQ's 16 for comparison.
    match BackoffPolicy::pulsar_multiplier(16) {
        Ok(pulsar) => {
            println!("Pulsar multiplier backoff (defaults, max_redeliver_count = 16), for nack:\n");
            println!("{}", explain_table(&pulsar, FailureReason::Nack));
        }
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }

    for arg in std::env::args().skip(1) {
        let policy: std::sync::Arc<dyn DeadLetterPolicy> =
            match arg.parse::<PolicySpec>().and_then(|s| s.build()) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            };
        println!("{arg}, for nack:\n");
        println!("{}", explain_table(&*policy, FailureReason::Nack));
    }
    ExitCode::SUCCESS
}
