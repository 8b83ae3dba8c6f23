//! Replay jobs, the paced dead-letter replays in progress (each stored
//! durably by its broker and resumed after a restart):
//! [`Admin::list_replay_jobs`] and [`Admin::cancel_replay_job`].

use ricochet_proto::{CancelReplayJobRequest, ListReplayJobsRequest};

use super::{Admin, ReplayJob, or_empty};
use crate::credentials::Transport;
use crate::error::Result;

impl Admin {
    /// The replay jobs in progress: all of them with `topic` `None`,
    /// otherwise those of `topic` (asked of its owner), and of
    /// `subscription` when given.
    pub async fn list_replay_jobs(
        &self,
        topic: Option<&str>,
        subscription: Option<&str>,
    ) -> Result<Vec<ReplayJob>> {
        let req = ListReplayJobsRequest {
            topic: or_empty(topic),
            subscription: or_empty(subscription),
            local_only: false,
        };
        let call = |t: Transport, r: ListReplayJobsRequest| async move {
            Self::rpc(t).list_replay_jobs(r).await
        };
        let r = match topic {
            Some(topic) => self.on_topic(topic, req, call).await?,
            None => self.on_service(req, call).await?,
        };
        Ok(r.jobs)
    }

    /// Stops replay job `id` (what it replayed stays replayed). A caller
    /// who is not a superuser names the job's `topic`, where the permission
    /// is checked; a job of another topic is then
    /// [`ErrorKind::NotFound`](crate::ErrorKind).
    pub async fn cancel_replay_job(&self, id: u64, topic: Option<&str>) -> Result<()> {
        let req = CancelReplayJobRequest {
            id,
            topic: or_empty(topic),
        };
        let call = |t: Transport, r: CancelReplayJobRequest| async move {
            Self::rpc(t).cancel_replay_job(r).await
        };
        match topic {
            Some(topic) => self.on_topic(topic, req, call).await.map(drop),
            None => self.on_service(req, call).await.map(drop),
        }
    }
}
