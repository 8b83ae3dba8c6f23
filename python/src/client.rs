//! `Client`: one connection to a broker (`Client.connect`), and the
//! factories of producers and consumers, whose keyword arguments map one to
//! one onto the client's builder methods. Arguments are checked when the
//! factory is called (a bad one raises there, before anything is sent);
//! the returned awaitable opens the stream.

use pyo3::prelude::*;
use ricochet_client::{Client, InitialPosition, PolicySpec, SubscriptionType};

use crate::consumer::PyConsumer;
use crate::convert::{self, opt_duration};
use crate::errors::{IntoPy, invalid};
use crate::producer::PyProducer;

/// A connection to a Ricochet broker, shared by the producers and consumers
/// made from it.
#[pyclass(name = "Client", module = "ricochet", frozen)]
#[derive(Debug)]
pub(crate) struct PyClient(Client);

#[pymethods]
impl PyClient {
    /// Connects to `url` (`http://host:port`, or `https://` with `tls_ca`).
    /// `token` is a bearer token (JWT) for a broker with authentication;
    /// `tls_ca` the CA certificate(s): PEM bytes or text, or a file path.
    #[staticmethod]
    #[pyo3(signature = (url, token = None, tls_ca = None, *, connect_timeout = None, request_timeout = None, reconnect_min = None, reconnect_max = None))]
    #[allow(clippy::too_many_arguments)]
    fn connect<'py>(
        py: Python<'py>,
        url: String,
        token: Option<String>,
        tls_ca: Option<&Bound<'py, PyAny>>,
        connect_timeout: Option<&Bound<'py, PyAny>>,
        request_timeout: Option<&Bound<'py, PyAny>>,
        reconnect_min: Option<&Bound<'py, PyAny>>,
        reconnect_max: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut b = Client::builder(url);
        if let Some(t) = token {
            b = b.token(t);
        }
        if let Some(ca) = tls_ca {
            b = b.tls_ca_pem(convert::pem(ca, "tls_ca")?);
        }
        if let Some(d) = opt_duration(connect_timeout, "connect_timeout")? {
            b = b.connect_timeout(d);
        }
        if let Some(d) = opt_duration(request_timeout, "request_timeout")? {
            b = b.request_timeout(d);
        }
        let min = opt_duration(reconnect_min, "reconnect_min")?;
        let max = opt_duration(reconnect_max, "reconnect_max")?;
        if min.is_some() || max.is_some() {
            let defaults = ricochet_client::ClientConfig::default();
            b = b.reconnect_backoff(
                min.unwrap_or(defaults.reconnect_min),
                max.unwrap_or(defaults.reconnect_max),
            );
        }
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            Ok(PyClient(b.connect().await.py()?))
        })
    }

    /// The broker URL.
    #[getter]
    fn url(&self) -> &str {
        self.0.url()
    }

    /// Opens a producer on `topic` (`orders` is
    /// `persistent://public/default/orders`). See the stubs for each option.
    #[pyo3(signature = (topic, name = None, *, batching = None, batch_max_messages = None, batch_max_bytes = None, batch_linger = None, send_timeout = None, max_pending_messages = None, max_pending_bytes = None, block_if_queue_full = None))]
    #[allow(clippy::too_many_arguments)]
    fn producer<'py>(
        &self,
        py: Python<'py>,
        topic: String,
        name: Option<String>,
        batching: Option<bool>,
        batch_max_messages: Option<usize>,
        batch_max_bytes: Option<usize>,
        batch_linger: Option<&Bound<'py, PyAny>>,
        send_timeout: Option<&Bound<'py, PyAny>>,
        max_pending_messages: Option<usize>,
        max_pending_bytes: Option<usize>,
        block_if_queue_full: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut b = self.0.producer(topic);
        if let Some(n) = name {
            b = b.name(n);
        }
        if let Some(on) = batching {
            b = b.batching(on);
        }
        if let Some(n) = batch_max_messages {
            b = b.batch_max_messages(n);
        }
        if let Some(n) = batch_max_bytes {
            b = b.batch_max_bytes(n);
        }
        if let Some(d) = opt_duration(batch_linger, "batch_linger")? {
            b = b.batch_linger(d);
        }
        if let Some(d) = opt_duration(send_timeout, "send_timeout")? {
            b = b.send_timeout(d);
        }
        if let Some(n) = max_pending_messages {
            b = b.max_pending_messages(n);
        }
        if let Some(n) = max_pending_bytes {
            b = b.max_pending_bytes(n);
        }
        if let Some(block) = block_if_queue_full {
            b = b.block_if_queue_full(block);
        }
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            Ok(PyProducer::new(b.create().await.py()?))
        })
    }

    /// Subscribes to `topic` as `subscription`. `type` is `exclusive`
    /// (default), `failover`, `shared` or `key_shared`; `policy` a policy
    /// spec in the compact form (`"backoff:fixed=1s,max=3"`, `"delay-levels"`)
    /// or JSON. See the stubs for each option.
    #[pyo3(signature = (topic, subscription, *, r#type = "exclusive", policy = None, ack_timeout = None, initial_position = "latest", name = None, receiver_queue_size = None, negative_ack_delay = None, retry_topic = None, dead_letter_topic = None, retry_enabled = None, dead_letter_reader = false, ack_receipts = false, ack_group_time = None, broker_nack_threshold = None, local_redelivery = None, local_redelivery_budget = None))]
    #[allow(clippy::too_many_arguments)]
    fn consumer<'py>(
        &self,
        py: Python<'py>,
        topic: String,
        subscription: String,
        r#type: &str,
        policy: Option<&str>,
        ack_timeout: Option<&Bound<'py, PyAny>>,
        initial_position: &str,
        name: Option<String>,
        receiver_queue_size: Option<u32>,
        negative_ack_delay: Option<&Bound<'py, PyAny>>,
        retry_topic: Option<String>,
        dead_letter_topic: Option<String>,
        retry_enabled: Option<bool>,
        dead_letter_reader: bool,
        ack_receipts: bool,
        ack_group_time: Option<&Bound<'py, PyAny>>,
        broker_nack_threshold: Option<&Bound<'py, PyAny>>,
        local_redelivery: Option<bool>,
        local_redelivery_budget: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let kind: SubscriptionType = r#type.parse().map_err(|e| invalid(format!("{e}")))?;
        let position: InitialPosition = initial_position
            .parse()
            .map_err(|e| invalid(format!("{e}")))?;
        let mut b = self
            .0
            .consumer(topic)
            .subscription(subscription)
            .subscription_type(kind)
            .initial_position(position)
            .dead_letter_reader(dead_letter_reader)
            .ack_receipts(ack_receipts);
        if let Some(spec) = policy {
            let spec: PolicySpec = spec.parse().map_err(ricochet_client::Error::from).py()?;
            b = b.policy(spec);
        }
        if let Some(d) = opt_duration(ack_timeout, "ack_timeout")? {
            b = b.ack_timeout(d);
        }
        if let Some(n) = name {
            b = b.consumer_name(n);
        }
        if let Some(n) = receiver_queue_size {
            b = b.receiver_queue_size(n);
        }
        if let Some(d) = opt_duration(negative_ack_delay, "negative_ack_delay")? {
            b = b.negative_ack_delay(d);
        }
        if let Some(t) = retry_topic {
            b = b.retry_topic(t);
        }
        if let Some(t) = dead_letter_topic {
            b = b.dead_letter_topic(t);
        }
        if let Some(on) = retry_enabled {
            b = b.retry_enabled(on);
        }
        if let Some(d) = opt_duration(ack_group_time, "ack_group_time")? {
            b = b.ack_group_time(d);
        }
        if let Some(d) = opt_duration(broker_nack_threshold, "broker_nack_threshold")? {
            b = b.broker_nack_threshold(d);
        }
        if let Some(on) = local_redelivery {
            b = b.local_redelivery(on);
        }
        if let Some(bytes) = local_redelivery_budget {
            b = b.local_redelivery_budget(bytes);
        }
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            Ok(PyConsumer::new(b.subscribe().await.py()?))
        })
    }

    fn __repr__(&self) -> String {
        format!("Client(url={:?})", self.0.url())
    }
}
