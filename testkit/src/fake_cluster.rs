//! A test double of a cluster's lookup service: [`FakeCluster`] serves only
//! `Cluster` (Lookup, ListBrokers) and `Partitions.GetPartitions`, answering
//! from a table the test fills, so a client given its URL is routed to real
//! brokers (say two [`crate::InProcessBroker`]s) chosen per topic, without
//! etcd. It records every lookup it answers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use ricochet_proto::cluster_server::{Cluster, ClusterServer};
use ricochet_proto::partitions_server::{Partitions, PartitionsServer};
use ricochet_proto::{
    BrokerInfo, ListBrokersRequest, ListBrokersResponse, LookupRequest, LookupResponse,
    PartitionedTopicMetadata, PartitionsRequest, UpdatePartitionsRequest,
};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

/// How the fake answers a lookup of a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeAnswer {
    /// Owned by this broker, live, at this epoch.
    Owner {
        /// Broker id.
        id: String,
        /// Its URL.
        url: String,
        /// Fencing epoch.
        epoch: u64,
    },
    /// Placed on this broker, which is down: UNAVAILABLE naming it in the
    /// structured details (reason `OWNER_DOWN`), as a broker does.
    Down {
        /// Broker id.
        id: String,
    },
    /// A standalone broker's answer (`cluster` empty) pointing at `url`.
    Standalone {
        /// Its URL.
        url: String,
    },
    /// UNIMPLEMENTED, as a broker older than clusters answers.
    Unimplemented,
    /// INVALID_ARGUMENT, as for a partitioned topic's base name.
    Invalid,
}

impl FakeAnswer {
    /// [`FakeAnswer::Owner`] at epoch 1.
    pub fn owner(id: &str, url: impl Into<String>) -> Self {
        FakeAnswer::Owner {
            id: id.to_owned(),
            url: url.into(),
            epoch: 1,
        }
    }
}

#[derive(Debug)]
struct State {
    cluster: String,
    answers: HashMap<String, FakeAnswer>,
    fallback: FakeAnswer,
    partitions: HashMap<String, u32>,
    brokers: Vec<BrokerInfo>,
    groups: Vec<ricochet_proto::ReplicationGroup>,
    lookups: Vec<String>,
}

/// The fully qualified name of `topic` (`orders` →
/// `persistent://public/default/orders`).
pub fn fq(topic: &str) -> String {
    if topic.contains("://") {
        topic.to_owned()
    } else if topic.contains('/') {
        format!("persistent://{topic}")
    } else {
        format!("persistent://public/default/{topic}")
    }
}

/// The fake lookup service; see the [module docs](self). Stops serving
/// when dropped.
#[derive(Debug)]
pub struct FakeCluster {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

#[derive(Debug, Clone)]
struct Svc(Arc<Mutex<State>>);

impl Svc {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[tonic::async_trait]
impl Cluster for Svc {
    async fn lookup(
        &self,
        request: Request<LookupRequest>,
    ) -> Result<Response<LookupResponse>, Status> {
        let topic = fq(&request.into_inner().topic);
        let mut st = self.state();
        st.lookups.push(topic.clone());
        let answer = st
            .answers
            .get(&topic)
            .cloned()
            .unwrap_or_else(|| st.fallback.clone());
        match answer {
            FakeAnswer::Owner { id, url, epoch } => Ok(Response::new(LookupResponse {
                topic,
                broker_id: id,
                url,
                live: true,
                epoch,
                cluster: st.cluster.clone(),
            })),
            FakeAnswer::Standalone { url } => Ok(Response::new(LookupResponse {
                topic,
                broker_id: "standalone".into(),
                url,
                live: true,
                epoch: 0,
                cluster: String::new(),
            })),
            FakeAnswer::Down { id } => {
                // As a broker answers: UNAVAILABLE with the structured
                // details naming the owner.
                let detail = ricochet_proto::error_details::Detail {
                    topic: Some(topic.clone()),
                    owner: Some(id.clone()),
                    ..ricochet_proto::error_details::Detail::new(
                        ricochet_proto::error_details::Reason::OwnerDown,
                    )
                };
                Err(ricochet_proto::error_details::attach(
                    tonic::Code::Unavailable,
                    format!("topic {topic} is placed on broker {id}, which is down"),
                    &detail,
                ))
            }
            FakeAnswer::Unimplemented => Err(Status::unimplemented("Cluster.Lookup")),
            FakeAnswer::Invalid => Err(Status::invalid_argument(format!(
                "{topic} is a partitioned topic: look up its partitions"
            ))),
        }
    }

    async fn list_brokers(
        &self,
        request: Request<ListBrokersRequest>,
    ) -> Result<Response<ListBrokersResponse>, Status> {
        let with_topics = request.into_inner().with_topics;
        let st = self.state();
        let brokers = st
            .brokers
            .iter()
            .cloned()
            .map(|mut b| {
                if !with_topics {
                    b.topics.clear();
                }
                b
            })
            .collect();
        Ok(Response::new(ListBrokersResponse {
            cluster: st.cluster.clone(),
            brokers,
            groups: st.groups.clone(),
        }))
    }

    async fn drain(
        &self,
        _: Request<ricochet_proto::DrainRequest>,
    ) -> Result<Response<ricochet_proto::DrainResponse>, Status> {
        Err(Status::unimplemented("the fake cluster moves no topics"))
    }

    async fn move_topic(
        &self,
        _: Request<ricochet_proto::MoveTopicRequest>,
    ) -> Result<Response<ricochet_proto::MoveTopicResponse>, Status> {
        Err(Status::unimplemented("the fake cluster moves no topics"))
    }

    async fn import_topic(
        &self,
        _: Request<tonic::Streaming<ricochet_proto::TopicTransferPart>>,
    ) -> Result<Response<ricochet_proto::ImportTopicResponse>, Status> {
        Err(Status::unimplemented("the fake cluster moves no topics"))
    }
}

#[tonic::async_trait]
impl Partitions for Svc {
    async fn create_partitioned_topic(
        &self,
        _: Request<UpdatePartitionsRequest>,
    ) -> Result<Response<PartitionedTopicMetadata>, Status> {
        Err(Status::unimplemented(
            "the fake cluster only answers lookups",
        ))
    }

    async fn get_partitions(
        &self,
        request: Request<PartitionsRequest>,
    ) -> Result<Response<PartitionedTopicMetadata>, Status> {
        let topic = fq(&request.into_inner().topic);
        let partitions = self.state().partitions.get(&topic).copied().unwrap_or(0);
        Ok(Response::new(PartitionedTopicMetadata {
            topic,
            partitions,
        }))
    }

    async fn update_partitions(
        &self,
        _: Request<UpdatePartitionsRequest>,
    ) -> Result<Response<PartitionedTopicMetadata>, Status> {
        Err(Status::unimplemented(
            "the fake cluster only answers lookups",
        ))
    }
}

impl FakeCluster {
    /// Serves on a free loopback port; lookups of topics without an answer
    /// get `fallback`. `cluster` is the name it answers with.
    pub async fn start(cluster: &str, fallback: FakeAnswer) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(Mutex::new(State {
            cluster: cluster.to_owned(),
            answers: HashMap::new(),
            fallback,
            partitions: HashMap::new(),
            brokers: Vec::new(),
            groups: Vec::new(),
            lookups: Vec::new(),
        }));
        let svc = Svc(state.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let _ = tonic::transport::Server::builder()
                .add_service(ClusterServer::new(svc.clone()))
                .add_service(PartitionsServer::new(svc))
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
        });
        Self {
            addr,
            state,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops serving and waits until it has (its connections told to go
    /// away and closed; at most 5 s, then the server task is aborted).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(std::time::Duration::from_secs(5), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Answers lookups of `topic` (short or fully qualified) with `answer`.
    pub fn route(&self, topic: &str, answer: FakeAnswer) {
        self.state().answers.insert(fq(topic), answer);
    }

    /// Answers `GetPartitions` of `topic` with `n`.
    pub fn partitioned(&self, topic: &str, n: u32) {
        self.state().partitions.insert(fq(topic), n);
    }

    /// What `ListBrokers` answers (its `topics` dropped unless asked for).
    pub fn brokers(&self, brokers: Vec<BrokerInfo>) {
        self.state().brokers = brokers;
    }

    /// What `ListBrokers` answers as the replicated topics' groups.
    pub fn groups(&self, groups: Vec<ricochet_proto::ReplicationGroup>) {
        self.state().groups = groups;
    }

    /// Every topic looked up so far, fully qualified, in order.
    pub fn lookups(&self) -> Vec<String> {
        self.state().lookups.clone()
    }
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
