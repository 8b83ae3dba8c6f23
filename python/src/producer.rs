//! `Producer`: sends from asyncio through one `ricochet_client::Producer`.
//!
//! Each `send` call queues its message at once, in call order, on a channel
//! to one task (the sequencer) that hands messages to
//! `Producer::send_async` one after the other, so sequence ids — and the
//! order on the topic — follow the order of the Python calls even when many
//! sends are in flight (`asyncio.gather`). The sequencer waits while the
//! client's bounded queue is full (or the send fails with `QueueFullError`
//! when the producer was made with `block_if_queue_full=False`); a waiting
//! message is held by its own awaiting `send` call, as in Rust. The
//! sequencer owns the only handle of the client's producer, so `close`
//! really closes the stream: it stops the sequencer once every queued
//! message is handed over, then closes the producer and reports what the
//! client reports.

use std::sync::Mutex;

use pyo3::prelude::*;
use ricochet_client::{OutgoingMessage, Producer, Receipt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::convert;
use crate::errors::{IntoPy, closed};
use crate::message::PyMessageId;

type Reply<T> = oneshot::Sender<ricochet_client::Result<T>>;

enum Job {
    Send(OutgoingMessage, Reply<Receipt>),
    Flush(Reply<()>),
}

/// What the Python object holds: the way to the sequencer, and the
/// sequencer itself (which gives the producer back when it ends).
struct Open {
    jobs: mpsc::UnboundedSender<Job>,
    sequencer: JoinHandle<Producer>,
}

/// A producer on one topic (or a partitioned topic's partitions).
#[pyclass(name = "Producer", module = "ricochet")]
pub(crate) struct PyProducer {
    open: Mutex<Option<Open>>,
    topic: String,
    name: String,
}

impl std::fmt::Debug for PyProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("topic", &self.topic)
            .field("name", &self.name)
            .finish()
    }
}

impl PyProducer {
    /// Wraps an open producer; must run on the runtime (it spawns).
    pub(crate) fn new(producer: Producer) -> Self {
        let topic = producer.topic().to_owned();
        let name = producer.name().to_owned();
        let (jobs, rx) = mpsc::unbounded_channel();
        let sequencer = tokio::spawn(sequence(producer, rx));
        Self {
            open: Mutex::new(Some(Open { jobs, sequencer })),
            topic,
            name,
        }
    }

    fn submit(&self, job: Job) -> PyResult<()> {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        match open.as_ref() {
            Some(o) if o.jobs.send(job).is_ok() => Ok(()),
            _ => Err(closed("producer")),
        }
    }
}

/// Hands queued messages to the client in order; returns the producer
/// once the channel is closed and drained.
async fn sequence(producer: Producer, mut jobs: mpsc::UnboundedReceiver<Job>) -> Producer {
    while let Some(job) = jobs.recv().await {
        match job {
            Job::Send(msg, reply) => {
                let _ = reply.send(producer.send_async(msg).await);
            }
            // Every earlier message is queued in the client by now.
            Job::Flush(reply) => {
                let _ = reply.send(producer.flush().await);
            }
        }
    }
    producer
}

#[pymethods]
impl PyProducer {
    /// The topic, fully qualified.
    #[getter]
    fn topic(&self) -> &str {
        &self.topic
    }

    /// The producer name (generated unless given).
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Queues a message now and returns an awaitable of its `MessageId`,
    /// resolved once the broker stored it (durably in its `sync` mode).
    #[pyo3(signature = (payload, key = None, properties = None, *, deliver_after = None, event_time = None))]
    fn send<'py>(
        &self,
        py: Python<'py>,
        payload: &Bound<'py, PyAny>,
        key: Option<String>,
        properties: Option<&Bound<'py, PyAny>>,
        deliver_after: Option<&Bound<'py, PyAny>>,
        event_time: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut msg = OutgoingMessage::builder(convert::payload(payload)?)
            .properties(convert::properties(properties)?);
        if let Some(k) = key {
            msg = msg.key(k);
        }
        if let Some(d) = convert::opt_duration(deliver_after, "deliver_after")? {
            msg = msg.deliver_after(d);
        }
        if let Some(t) = event_time {
            let at = std::time::Duration::try_from_secs_f64(t).map_err(|_| {
                crate::errors::invalid(format!(
                    "event_time must be non-negative seconds since the epoch, not {t}"
                ))
            })?;
            msg = msg.event_time(std::time::UNIX_EPOCH + at);
        }
        let (tx, rx) = oneshot::channel();
        self.submit(Job::Send(msg.build(), tx))?;
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let receipt = rx.await.map_err(|_| closed("producer"))?.py()?;
            Ok(PyMessageId(receipt.await.py()?))
        })
    }

    /// Sends the current batch now and waits until every message sent
    /// before is receipted (or failed).
    fn flush<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (tx, rx) = oneshot::channel();
        self.submit(Job::Flush(tx))?;
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            rx.await.map_err(|_| closed("producer"))?.py()
        })
    }

    /// Flushes, waits for the outstanding receipts, then closes the stream.
    /// Later sends raise `ClosedError`. Raises what the client reports if a
    /// message was not answered (`RicochetTimeoutError`) or the producer had
    /// stopped on its own; a second `close` raises `ClosedError`.
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner()).take();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let Some(Open { jobs, sequencer }) = open else {
                return Err(closed("producer"));
            };
            drop(jobs);
            let producer = sequencer.await.map_err(|e| {
                crate::errors::of_kind(ricochet_client::ErrorKind::Internal, e.to_string())
            })?;
            producer.close().await.py()
        })
    }

    fn __aenter__<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let me: Py<Self> = slf.unbind();
        pyo3_async_runtimes::tokio::future_into_py(py, async move { Ok(me) })
    }

    #[pyo3(signature = (*_exc))]
    fn __aexit__<'py>(
        &self,
        py: Python<'py>,
        _exc: &Bound<'py, pyo3::types::PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let open = self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        if open {
            self.close(py)
        } else {
            // Closed inside the block already: that close reported.
            pyo3_async_runtimes::tokio::future_into_py(py, async { Ok(()) })
        }
    }

    fn __repr__(&self) -> String {
        format!("Producer(topic={:?}, name={:?})", self.topic, self.name)
    }
}
