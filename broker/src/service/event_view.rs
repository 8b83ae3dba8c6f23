//! What a reader of a namespace's failure-events topic sees. A
//! dead-lettered event carries the start of the failed message's payload
//! (`payload_excerpt`): that is another topic's data, so it is shown only to
//! a role that may read that topic's messages (consume or dead-letters on
//! the event's `topic`); for any other reader it is taken out of the event.
//! Applied where event payloads leave the broker: consumer streams on an
//! events topic ([`EventView`]) and `GetMessage` (the RPC table's answer
//! filter, [`hide_excerpt`]).

use crate::auth::{Auth, Permission, Principal};
use crate::name::is_system_topic;
use ricochet_proto::Message;
use std::sync::Arc;

/// One consumer stream's view of an events topic.
#[derive(Debug, Clone)]
pub(super) struct EventView {
    auth: Arc<Auth>,
    principal: Option<Principal>,
}

impl EventView {
    /// The view `principal` gets of `topic`'s messages; `None` when nothing
    /// is hidden from it (not an events topic, auth off, a superuser).
    pub(super) fn of(auth: &Arc<Auth>, principal: Option<&Principal>, topic: &str) -> Option<Self> {
        (is_system_topic(topic) && !auth.is_superuser(principal)).then(|| Self {
            auth: auth.clone(),
            principal: principal.cloned(),
        })
    }

    /// [`hide_excerpt`] for this stream's reader.
    pub(super) fn apply(&self, m: &mut Message) {
        hide_excerpt(&self.auth, self.principal.as_ref(), m);
    }
}

/// Takes the payload excerpt out of `m`, an event, unless `p` may read the
/// topic the event is about (its `topic` property).
pub(crate) fn hide_excerpt(auth: &Auth, p: Option<&Principal>, m: &mut Message) {
    let may_read = m.properties.get("topic").is_some_and(|t| {
        [Permission::Consume, Permission::DeadLetters]
            .into_iter()
            .any(|perm| auth.holds(p, t, perm))
    });
    if !may_read && let Some(hidden) = crate::events::without_excerpt(&m.payload) {
        m.payload = hidden;
    }
}
