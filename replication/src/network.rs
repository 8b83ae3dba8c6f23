//! Raft RPCs over tonic: the `Replication` service (server side, one per
//! broker, routing each request to its group) and the client a group's
//! Raft uses to reach its peers.
//!
//! Bodies are openraft's request, response and error values in CBOR
//! ([`crate::encode`]). A transport failure (peer down, connection cut,
//! deadline) is `Unreachable` to openraft, which backs off before retrying;
//! an error the peer's Raft returned travels back as that error.
//!
//! How a peer is reached is the broker's to say ([`PeerTransport`]): over
//! TLS, trusting the CA it names, when the brokers listen with TLS; with a
//! broker's token in each call's `authorization` metadata when they check
//! credentials (the broker's server then admits the call only from a
//! superuser role).
//!
//! Every request speaks for one node of its group ([`claimed_node`]: a
//! vote for its candidate, an append or a snapshot chunk for the leader in
//! its vote, an `Elect` for its sender), and must say so in `from` too.
//! Before a request reaches its group, the service asks its [`PeerGuard`]
//! (the broker's, when it checks credentials) whether the caller may speak
//! for that node; a refusal is the guard's status, a body that does not
//! decode INVALID_ARGUMENT, and neither touches the group.

// openraft's traits fix these error types (StorageError, RPCError), large as they are.
#![allow(clippy::result_large_err)]

use crate::proto::replication_client::ReplicationClient;
use crate::proto::replication_server::{Replication, ReplicationServer};
use crate::proto::{RaftReply, RaftRequest};
use crate::{NodeId, Raft, TypeConfig, decode, encode, encode_sized};
use openraft::BasicNode;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Response, Status};

/// The groups this broker is a member of, by name: where the
/// `Replication` service sends each request.
#[derive(Clone, Default)]
pub struct GroupRegistry {
    groups: Arc<RwLock<HashMap<String, Raft>>>,
}

impl std::fmt::Debug for GroupRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let groups = self.groups.read().unwrap_or_else(|p| p.into_inner());
        f.debug_set().entries(groups.keys()).finish()
    }
}

impl GroupRegistry {
    /// Routes requests for `group` to `raft`.
    pub fn insert(&self, group: &str, raft: Raft) {
        self.groups
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(group.to_owned(), raft);
    }

    /// Stops routing requests for `group`.
    pub fn remove(&self, group: &str) {
        self.groups
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(group);
    }

    fn get(&self, group: &str) -> Result<Raft, Status> {
        self.groups
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(group)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("no raft group {group:?} on this broker")))
    }
}

/// Which call of the `Replication` service a request is (shown with its
/// article: "an append entries request").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerCall {
    /// Raft's AppendEntries (a heartbeat included).
    AppendEntries,
    /// Raft's RequestVote.
    Vote,
    /// A chunk of a snapshot being installed.
    InstallSnapshot,
    /// A leader asking a member to stand for election (a transfer).
    Elect,
}

impl std::fmt::Display for PeerCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::AppendEntries => "an append entries request",
            Self::Vote => "a vote request",
            Self::InstallSnapshot => "an install snapshot request",
            Self::Elect => "an elect request",
        })
    }
}

/// Decides, per request, whether its caller may speak for the node of the
/// group it claims to be (the broker's check of per-broker identities).
pub trait PeerGuard: Send + Sync + std::fmt::Debug {
    /// `Ok` to let the request through; the status it is refused with
    /// otherwise. `caller` holds what the server's layers found out about
    /// the caller (the broker's authenticated role).
    fn admit(
        &self,
        caller: &tonic::Extensions,
        group: &str,
        call: PeerCall,
        node: NodeId,
    ) -> Result<(), Status>;
}

/// The node a request of `call` speaks for: `in_body`, the node its body
/// names (`None` for an `Elect`, whose body names none), which must be its
/// sender `from`; refused when they differ or the body names no node.
pub fn claimed_node(
    call: PeerCall,
    from: NodeId,
    in_body: Option<NodeId>,
) -> Result<NodeId, Status> {
    let node = match (call, in_body) {
        (PeerCall::Elect, _) => return Ok(from),
        (_, Some(node)) => node,
        (_, None) => {
            return Err(Status::invalid_argument(format!(
                "{call} must name the node it comes from in its vote"
            )));
        }
    };
    if node != from {
        return Err(Status::permission_denied(format!(
            "{call} sent as node {from} speaks for node {node}"
        )));
    }
    Ok(node)
}

/// The node a decoded request body speaks for (see [`claimed_node`]).
trait Speaks {
    fn node(&self) -> Option<NodeId>;
}

impl Speaks for AppendEntriesRequest<TypeConfig> {
    fn node(&self) -> Option<NodeId> {
        self.vote.leader_id().voted_for()
    }
}

impl Speaks for VoteRequest<NodeId> {
    fn node(&self) -> Option<NodeId> {
        self.vote.leader_id().voted_for()
    }
}

impl Speaks for SnapshotChunk {
    fn node(&self) -> Option<NodeId> {
        self.vote.leader_id().voted_for()
    }
}

impl Speaks for Option<u64> {
    fn node(&self) -> Option<NodeId> {
        None
    }
}

/// The server side of the `Replication` service.
#[derive(Debug, Clone)]
pub struct ReplicationService {
    registry: GroupRegistry,
    guard: Option<Arc<dyn PeerGuard>>,
}

impl ReplicationService {
    /// A service routing to the groups of `registry`, admitting every
    /// request whose claim is consistent (see [`claimed_node`]).
    pub fn new(registry: GroupRegistry) -> Self {
        Self {
            registry,
            guard: None,
        }
    }

    /// The service asking `guard` about each request before it reaches
    /// its group.
    pub fn with_guard(mut self, guard: Arc<dyn PeerGuard>) -> Self {
        self.guard = Some(guard);
        self
    }

    /// The tonic service, to add to a server.
    pub fn into_server(self) -> ReplicationServer<Self> {
        ReplicationServer::new(self)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX)
    }

    /// The group `req` is for and its decoded body, once the caller was
    /// admitted to speak for the node the body claims.
    fn open<T: DeserializeOwned + Speaks>(
        &self,
        call: PeerCall,
        req: Request<RaftRequest>,
    ) -> Result<(Raft, T), Status> {
        let (_, extensions, req) = req.into_parts();
        let raft = self.registry.get(&req.group)?;
        let body: T = decode(&req.body)
            .map_err(|e| Status::invalid_argument(format!("the body of {call}: {e}")))?;
        let node = claimed_node(call, req.from, body.node())?;
        if let Some(guard) = &self.guard {
            guard.admit(&extensions, &req.group, call, node)?;
        }
        Ok((raft, body))
    }
}

fn reply<T: Serialize, E: Serialize>(r: Result<T, E>) -> Result<Response<RaftReply>, Status> {
    let internal = |e: crate::ReplicationError| Status::internal(e.to_string());
    let out = match r {
        Ok(v) => RaftReply {
            body: encode(&v).map_err(internal)?,
            error: Vec::new(),
        },
        Err(e) => RaftReply {
            body: Vec::new(),
            error: encode(&e).map_err(internal)?,
        },
    };
    Ok(Response::new(out))
}

#[tonic::async_trait]
impl Replication for ReplicationService {
    async fn append_entries(
        &self,
        req: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let (raft, rpc): (_, AppendEntriesRequest<TypeConfig>) =
            self.open(PeerCall::AppendEntries, req)?;
        reply(raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        let group = req.get_ref().group.clone();
        let (raft, rpc): (_, VoteRequest<NodeId>) = self.open(PeerCall::Vote, req)?;
        let answer = raft.vote(rpc.clone()).await;
        if let Ok(resp) = &answer {
            crate::takeover::after_vote(&group, &raft, &rpc, resp);
        }
        reply(answer)
    }

    async fn elect(&self, req: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        let group = req.get_ref().group.clone();
        let (raft, wanted): (_, Option<u64>) = self.open(PeerCall::Elect, req)?;
        let (me, voter, held) = {
            let m = raft.metrics();
            let m = m.borrow();
            (m.id, crate::takeover::is_voter(&m), m.last_log_index)
        };
        if !voter {
            return Err(Status::failed_precondition(format!(
                "node {me} is not a voter of group {group}"
            )));
        }
        if held < wanted {
            return Err(Status::failed_precondition(format!(
                "node {me} of group {group} holds its log up to {held:?}, the leader's ends at {wanted:?}"
            )));
        }
        tracing::info!(%group, node = me, "asked by the leader to stand for election (leadership transfer)");
        raft.trigger()
            .elect()
            .await
            .map_err(|e| Status::unavailable(format!("group {group}: {e}")))?;
        reply(Ok::<(), ()>(()))
    }

    async fn install_snapshot(
        &self,
        req: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let (raft, chunk): (_, SnapshotChunk) = self.open(PeerCall::InstallSnapshot, req)?;
        reply(raft.install_snapshot(chunk.into_request()).await)
    }
}

/// A snapshot chunk as it travels: openraft's `InstallSnapshotRequest`
/// with its data as one CBOR byte string (serde would write a `Vec<u8>`
/// as an array of numbers, a byte each, and decode it as slowly).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct SnapshotChunk {
    vote: openraft::Vote<NodeId>,
    meta: openraft::SnapshotMeta<NodeId, BasicNode>,
    offset: u64,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
    done: bool,
}

impl SnapshotChunk {
    fn from_request(r: InstallSnapshotRequest<TypeConfig>) -> Self {
        Self {
            vote: r.vote,
            meta: r.meta,
            offset: r.offset,
            data: r.data,
            done: r.done,
        }
    }

    fn into_request(self) -> InstallSnapshotRequest<TypeConfig> {
        InstallSnapshotRequest {
            vote: self.vote,
            meta: self.meta,
            offset: self.offset,
            data: self.data,
            done: self.done,
        }
    }
}

/// How this broker reaches its peers' `Replication` service: the TLS setup
/// for `https://` peers, and the file holding the token its calls carry.
#[derive(Clone, Default)]
pub struct PeerTransport {
    /// Used for a peer whose address is `https://` (the CA that signed the
    /// peers' certificates; a client identity when they ask for one). A
    /// `https://` peer without it is unreachable, with that reason logged.
    pub tls: Option<ClientTlsConfig>,
    /// A file holding the token (a JWT, as `ricochet --token` takes it) sent
    /// as `authorization: Bearer <token>` on every call; read each time a
    /// connection to a peer is made, so a renewed token is picked up.
    pub token_file: Option<PathBuf>,
}

impl std::fmt::Debug for PeerTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTransport")
            .field("tls", &self.tls.is_some())
            .field("token_file", &self.token_file)
            .finish()
    }
}

impl PeerTransport {
    /// The `authorization` value of `token_file`'s token, if one is set.
    pub fn authorization(&self) -> Result<Option<AsciiMetadataValue>, String> {
        let Some(path) = &self.token_file else {
            return Ok(None);
        };
        let token = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the peer token file {}: {e}", path.display()))?;
        format!("Bearer {}", token.trim())
            .parse()
            .map(Some)
            .map_err(|_| {
                format!(
                    "the peer token file {} does not hold a token that fits in a header",
                    path.display()
                )
            })
    }

    /// A lazily connecting channel to the peer at `addr`.
    fn channel(&self, addr: &str) -> Result<Channel, String> {
        let mut endpoint = Endpoint::from_shared(addr.to_owned()).map_err(|e| e.to_string())?;
        if addr.starts_with("https://") {
            let tls = self.tls.clone().ok_or_else(|| {
                "the peer listens with TLS and this broker knows no CA to verify it \
                 ([cluster] peer_ca_file or [tls] client_ca_file)"
                    .to_owned()
            })?;
            endpoint = endpoint.tls_config(tls).map_err(|e| e.to_string())?;
        }
        Ok(endpoint
            .connect_timeout(Duration::from_secs(1))
            .connect_lazy())
    }
}

/// Asks the member of `group` whose broker's `Replication` service is at
/// `addr` to stand for election at once (the `Elect` RPC; like every call
/// of that service, admitted from a superuser only when the brokers check
/// credentials), on behalf of the leader `from`, whose log ends at
/// `last_index`.
pub async fn ask_to_elect(
    transport: &PeerTransport,
    addr: &str,
    group: &str,
    from: NodeId,
    last_index: Option<u64>,
) -> crate::Result<()> {
    let peer = |e: String| crate::ReplicationError::Raft(format!("asking {addr} to stand: {e}"));
    let channel = transport.channel(addr).map_err(peer)?;
    let mut req = Request::new(RaftRequest {
        group: group.to_owned(),
        from,
        body: encode(&last_index)?,
    });
    req.set_timeout(Duration::from_secs(5));
    if let Some(a) = transport.authorization().map_err(peer)? {
        req.metadata_mut().insert("authorization", a);
    }
    ReplicationClient::new(channel)
        .elect(req)
        .await
        .map_err(|s| peer(s.message().to_owned()))?;
    Ok(())
}

/// Makes a group's clients to its peers.
#[derive(Debug, Clone)]
pub struct NetworkFactory {
    group: String,
    from: NodeId,
    overrides: BTreeMap<NodeId, String>,
    transport: PeerTransport,
}

impl NetworkFactory {
    /// Clients for `group`, sent from node `from` over `transport`,
    /// reaching the peers in `overrides` there rather than at their
    /// membership address.
    pub fn new(
        group: &str,
        from: NodeId,
        overrides: BTreeMap<NodeId, String>,
        transport: PeerTransport,
    ) -> Self {
        Self {
            group: group.to_owned(),
            from,
            overrides,
            transport,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        let addr = self.overrides.get(&target).unwrap_or(&node.addr).clone();
        let client = self
            .transport
            .channel(&addr)
            .and_then(|channel| Ok((channel, self.transport.authorization()?)))
            .map(|(channel, authorization)| Peer {
                client: ReplicationClient::new(channel)
                    .max_decoding_message_size(usize::MAX)
                    .max_encoding_message_size(usize::MAX),
                authorization,
            })
            .map_err(|e| {
                let e = format!("peer {target} at {addr:?}: {e}");
                tracing::warn!(group = %self.group, error = %e, "raft peer unreachable");
                e
            });
        PeerClient {
            group: self.group.clone(),
            from: self.from,
            target,
            client,
        }
    }
}

/// A peer's client with the credential its calls carry.
#[derive(Debug)]
struct Peer {
    client: ReplicationClient<Channel>,
    authorization: Option<AsciiMetadataValue>,
}

/// A group's connection to one peer.
#[derive(Debug)]
pub struct PeerClient {
    group: String,
    from: NodeId,
    target: NodeId,
    client: Result<Peer, String>,
}

#[derive(Debug, Clone, Copy)]
enum Rpc {
    Append,
    Vote,
    Snapshot,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl PeerClient {
    async fn call<Req, Resp, E>(
        &mut self,
        rpc: Rpc,
        body: &Req,
        size: usize,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let peer = match &mut self.client {
            Ok(c) => c,
            Err(e) => {
                let e = std::io::Error::other(e.clone());
                return Err(RPCError::Unreachable(Unreachable::new(&e)));
            }
        };
        let body =
            encode_sized(body, size).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut req = Request::new(RaftRequest {
            group: self.group.clone(),
            from: self.from,
            body,
        });
        req.set_timeout(option.hard_ttl());
        if let Some(a) = &peer.authorization {
            req.metadata_mut().insert("authorization", a.clone());
        }
        let client = &mut peer.client;
        let sent = match rpc {
            Rpc::Append => client.append_entries(req).await,
            Rpc::Vote => client.vote(req).await,
            Rpc::Snapshot => client.install_snapshot(req).await,
        };
        let reply = sent
            .map_err(|status| RPCError::Unreachable(Unreachable::new(&status)))?
            .into_inner();
        if !reply.error.is_empty() {
            let e: RaftError<NodeId, E> =
                decode(&reply.error).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
            return Err(RPCError::RemoteError(RemoteError::new(self.target, e)));
        }
        decode(&reply.body).map_err(|e| RPCError::Network(NetworkError::new(&e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        let size = rpc
            .entries
            .iter()
            .map(|e| match &e.payload {
                openraft::EntryPayload::Normal(c) => c.encoded_size() + 64,
                _ => 256,
            })
            .sum::<usize>()
            + 256;
        if rpc.entries.is_empty() {
            return self.call(Rpc::Append, &rpc, size, &option).await;
        }
        let started = std::time::Instant::now();
        let answer = self.call(Rpc::Append, &rpc, size, &option).await;
        metrics::histogram!(crate::latency::APPEND_ENTRIES, "peer" => self.target.to_string())
            .record(started.elapsed());
        answer
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        let size = rpc.data.len() + 1024;
        self.call(
            Rpc::Snapshot,
            &SnapshotChunk::from_request(rpc),
            size,
            &option,
        )
        .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.call(Rpc::Vote, &rpc, 256, &option).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, LogId, Vote};

    fn log_id(term: u64, node: NodeId, index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(term, node), index)
    }

    /// The node a body speaks for, as the service reads it off the wire.
    fn speaks<T: Serialize + DeserializeOwned + Speaks>(body: &T) -> Option<NodeId> {
        decode::<T>(&encode(body).unwrap()).unwrap().node()
    }

    #[test]
    fn each_request_speaks_for_the_node_its_vote_names() {
        let vote = VoteRequest::new(Vote::new(7, 3), Some(log_id(6, 1, 40)));
        assert_eq!(speaks(&vote), Some(3), "a vote: its candidate");
        let append = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(9, 2),
            prev_log_id: Some(log_id(9, 2, 10)),
            entries: Vec::new(),
            leader_commit: None,
        };
        assert_eq!(speaks(&append), Some(2), "an append: the leader");
        let chunk = SnapshotChunk {
            vote: Vote::new_committed(4, 5),
            meta: openraft::SnapshotMeta {
                last_log_id: Some(log_id(4, 5, 99)),
                last_membership: Default::default(),
                snapshot_id: "s".into(),
            },
            offset: 0,
            data: vec![1, 2, 3],
            done: true,
        };
        assert_eq!(speaks(&chunk), Some(5), "a snapshot chunk: the leader");
        assert_eq!(speaks(&Some(12u64)), None, "an elect body names none");
    }

    #[test]
    fn the_claim_must_match_the_sender() {
        assert_eq!(claimed_node(PeerCall::Vote, 3, Some(3)).unwrap(), 3);
        assert_eq!(
            claimed_node(PeerCall::AppendEntries, 2, Some(2)).unwrap(),
            2
        );
        assert_eq!(
            claimed_node(PeerCall::InstallSnapshot, 5, Some(5)).unwrap(),
            5
        );
        // An elect speaks for its sender.
        assert_eq!(claimed_node(PeerCall::Elect, 4, None).unwrap(), 4);
        // A body for another node than the sender's: refused.
        let e = claimed_node(PeerCall::AppendEntries, 3, Some(1)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            e.message(),
            "an append entries request sent as node 3 speaks for node 1"
        );
        let e = claimed_node(PeerCall::Vote, 3, None).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn a_bad_body_is_an_error_not_a_panic() {
        for bytes in [
            &b""[..],
            &b"\xff\xff\xff"[..],
            &b"\x9f\x9f\x9f\x9f"[..],
            // a map claiming 2^32 entries
            &b"\xba\xff\xff\xff\xff"[..],
        ] {
            assert!(decode::<VoteRequest<NodeId>>(bytes).is_err());
            assert!(decode::<AppendEntriesRequest<TypeConfig>>(bytes).is_err());
            assert!(decode::<SnapshotChunk>(bytes).is_err());
        }
        // A body of the wrong request: an error too.
        let vote = encode(&VoteRequest::new(Vote::new(7, 3), None)).unwrap();
        assert!(decode::<SnapshotChunk>(&vote).is_err());
    }
}
