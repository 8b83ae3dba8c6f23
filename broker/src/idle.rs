//! The scheduling priority of the background verify pass's threads
//! (`verify_on_start = "background"`): Linux's `SCHED_IDLE`, so that they
//! run only on a core nothing of normal priority wants and a waking
//! serving thread takes the core from them at once; nice 19 where that
//! policy is refused. What the pass reads and reports is unchanged; only
//! when it gets a core is.

/// The nice value a pass's thread takes at least, whatever its policy
/// (the priority it keeps if `SCHED_IDLE` is refused).
pub(crate) const BACKGROUND_NICE: i32 = 19;

/// Lowers the calling thread's priority: `SCHED_IDLE`, then nice
/// [`BACKGROUND_NICE`] at least. Errors leave the thread as it was (the
/// pass then only competes harder with serving).
pub(crate) fn lower_this_thread() {
    #[cfg(target_os = "linux")]
    {
        use thread_priority::{
            NormalThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
            set_thread_priority_and_policy, thread_native_id,
        };
        // The crate also sets the nice value to the policy's only priority
        // (0) once the policy is set; the nice value is set again below.
        let _ = set_thread_priority_and_policy(
            thread_native_id(),
            ThreadPriority::Min,
            ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle),
        );
    }
    // With no id, `setpriority` changes the calling thread's nice value on
    // Linux (the process's elsewhere).
    use rustix::process::{getpriority_process, setpriority_process};
    let now = getpriority_process(None).unwrap_or(0);
    let _ = setpriority_process(None, now.max(BACKGROUND_NICE));
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::storage::SledStorage;
    use crate::storage::prelude::*;
    use prost::Message as _;

    /// `SCHED_IDLE` in `sched.h`.
    const SCHED_IDLE: u64 = 5;

    /// The calling thread's (policy, nice value), as the kernel reports
    /// them in `/proc/thread-self/stat` (fields 41 and 19).
    fn policy_and_nice() -> (u64, i64) {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        // The fields after the command name (which may hold spaces) start
        // at field 3.
        let rest: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
            .split_whitespace()
            .collect();
        (rest[41 - 3].parse().unwrap(), rest[19 - 3].parse().unwrap())
    }

    #[test]
    fn the_background_pass_reads_on_idle_priority_threads_and_still_reports_damage() {
        const TOPIC: &str = "persistent://public/default/t";
        let dir = tempfile::tempdir().unwrap();
        let sled = SledStorage::open(dir.path(), 4, 8 << 20).unwrap();
        for id in 0..12 {
            let entry = ricochet_proto::Message {
                payload: format!("message {id}").into_bytes(),
                ..Default::default()
            }
            .encode_to_vec();
            sled.append(TOPIC, id, &[entry], None).unwrap();
        }
        sled.damage_entry(TOPIC, 5, 7);
        let before = policy_and_nice();
        let seen = std::sync::Mutex::new(Vec::new());
        // The hook the broker's background pass runs on each of its
        // threads, then what the kernel says of that thread.
        let report = sled.verify_live_on(&|| false, &|| {
            lower_this_thread();
            seen.lock().unwrap().push(policy_and_nice());
        });
        let seen = seen.into_inner().unwrap();
        assert!(!seen.is_empty(), "the pass read on no thread of its own");
        for (policy, nice) in &seen {
            assert_eq!(*policy, SCHED_IDLE, "a pass thread's policy: {seen:?}");
            assert!(*nice >= BACKGROUND_NICE as i64, "{seen:?}");
        }
        // What the pass finds is what it found at normal priority.
        assert!(report.complete);
        assert_eq!(report.problem_count, 1, "{:?}", report.problems);
        assert!(report.problems[0].contains(TOPIC), "{:?}", report.problems);
        // The caller's own thread (the broker's blocking-pool thread) is
        // left as it was.
        assert_eq!(policy_and_nice(), before);
    }
}
