//! `Consumer`: an async iterator of `Message`s over one
//! `ricochet_client::Consumer`, with the settle methods (`ack`, `nack`,
//! `reconsume_later`, `terminate`, ...) of its cloneable `Acker`, so a
//! settle never waits for a pending receive. `close` first ends a pending
//! receive (the iteration stops), then closes the client's consumer and
//! reports what it reports.

use std::sync::Arc;

use pyo3::exceptions::PyStopAsyncIteration;
use pyo3::prelude::*;
use ricochet_client::{Acker, Consumer, ErrorKind};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::convert;
use crate::errors::{IntoPy, closed, invalid};
use crate::message::PyMessage;

/// A consumer of one subscription.
#[pyclass(name = "Consumer", module = "ricochet")]
pub(crate) struct PyConsumer {
    consumer: Arc<Mutex<Consumer>>,
    acker: Acker,
    closing: CancellationToken,
    topic: String,
    subscription: String,
    name: String,
}

impl std::fmt::Debug for PyConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("topic", &self.topic)
            .field("subscription", &self.subscription)
            .field("name", &self.name)
            .finish()
    }
}

impl PyConsumer {
    pub(crate) fn new(consumer: Consumer) -> Self {
        Self {
            acker: consumer.acker(),
            topic: consumer.topic().to_owned(),
            subscription: consumer.subscription().to_owned(),
            name: consumer.consumer_name().to_owned(),
            consumer: Arc::new(Mutex::new(consumer)),
            closing: CancellationToken::new(),
        }
    }

    /// The next message, or `None` once the consumer is closed.
    fn next_message<'py>(
        &self,
        py: Python<'py>,
        end: fn() -> PyErr,
    ) -> PyResult<Bound<'py, PyAny>> {
        let consumer = self.consumer.clone();
        let closing = self.closing.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let received = tokio::select! {
                biased;
                _ = closing.cancelled() => return Err(end()),
                r = async { consumer.lock().await.receive().await } => r,
            };
            match received {
                Ok(m) => Ok(PyMessage(Arc::new(m))),
                Err(e) if e.kind() == ErrorKind::Closed => Err(end()),
                Err(e) => Err(e).py(),
            }
        })
    }

    /// Runs a settle call of the acker on the runtime.
    fn settle<'py, F, Fut>(
        &self,
        py: Python<'py>,
        msg: &PyMessage,
        call: F,
    ) -> PyResult<Bound<'py, PyAny>>
    where
        F: FnOnce(Acker, Arc<ricochet_client::Message>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ricochet_client::Result<()>> + Send + 'static,
    {
        let acker = self.acker.clone();
        let msg = msg.0.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move { call(acker, msg).await.py() })
    }
}

fn stop_iteration() -> PyErr {
    PyStopAsyncIteration::new_err(())
}

fn closed_consumer() -> PyErr {
    closed("consumer")
}

#[pymethods]
impl PyConsumer {
    /// The topic, fully qualified.
    #[getter]
    fn topic(&self) -> &str {
        &self.topic
    }

    #[getter]
    fn subscription(&self) -> &str {
        &self.subscription
    }

    /// The consumer name (generated unless given).
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The next message. Raises `ClosedError` once the consumer is closed,
    /// or the cause if it could not reconnect.
    fn receive<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.next_message(py, closed_consumer)
    }

    fn __aiter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// `async for msg in consumer`: ends when the consumer is closed.
    fn __anext__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.next_message(py, stop_iteration)
    }

    /// Acknowledges the message (grouped with others; `flush` confirms).
    fn ack<'py>(&self, py: Python<'py>, msg: PyRef<'py, PyMessage>) -> PyResult<Bound<'py, PyAny>> {
        self.settle(py, &msg, |a, m| async move { a.ack(&m).await })
    }

    /// Acknowledges the message and every earlier one of the main topic
    /// (Exclusive and Failover subscriptions only).
    fn ack_cumulative<'py>(
        &self,
        py: Python<'py>,
        msg: PyRef<'py, PyMessage>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.settle(py, &msg, |a, m| async move { a.ack_cumulative(&m).await })
    }

    /// A negative ack: the message comes back after the delay the policy
    /// gives its next attempt, or is dead-lettered when the policy says so.
    #[pyo3(signature = (msg, reason = None))]
    fn nack<'py>(
        &self,
        py: Python<'py>,
        msg: PyRef<'py, PyMessage>,
        reason: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.settle(py, &msg, |a, m| async move {
            match reason {
                Some(r) => a.nack_with_reason(&m, r).await,
                None => a.nack(&m).await,
            }
        })
    }

    /// Retries the message through the subscription's retry tier: after
    /// `delay` (seconds or a timedelta), at delay `level` (-1 dead-letters
    /// now, 0 lets the policy decide, k > 0 is level k), or, with neither,
    /// when the policy says. `properties` are added to the retried message
    /// (with a delay only).
    #[pyo3(signature = (msg, delay = None, level = None, properties = None))]
    fn reconsume_later<'py>(
        &self,
        py: Python<'py>,
        msg: PyRef<'py, PyMessage>,
        delay: Option<&Bound<'py, PyAny>>,
        level: Option<i32>,
        properties: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let delay = convert::opt_duration(delay, "delay")?;
        let props = convert::properties(properties)?;
        match (delay, level) {
            (Some(_), Some(_)) => Err(invalid("give reconsume_later a delay or a level, not both")),
            (Some(d), None) => self.settle(py, &msg, move |a, m| async move {
                if props.is_empty() {
                    a.reconsume_later(&m, d).await
                } else {
                    a.reconsume_later_with(&m, d, props).await
                }
            }),
            (None, level) => {
                if !props.is_empty() {
                    return Err(invalid(
                        "reconsume_later takes properties with a delay only",
                    ));
                }
                let level = level.unwrap_or(0);
                self.settle(py, &msg, move |a, m| async move {
                    a.reconsume_later_level(&m, level).await
                })
            }
        }
    }

    /// Dead-letters the message at once with `reason`; resolves once the
    /// move is durable.
    fn terminate<'py>(
        &self,
        py: Python<'py>,
        msg: PyRef<'py, PyMessage>,
        reason: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.settle(
            py,
            &msg,
            |a, m| async move { a.terminate(&m, reason).await },
        )
    }

    /// Restarts the message's ack timeout (no attempt is counted).
    fn extend_ack_deadline<'py>(
        &self,
        py: Python<'py>,
        msg: PyRef<'py, PyMessage>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.settle(
            py,
            &msg,
            |a, m| async move { a.extend_ack_deadline(&m).await },
        )
    }

    /// Sends pending acks and waits until the broker made every ack (and
    /// queued `reconsume_later`) so far durable; raises `UnconfirmedError`
    /// naming how many were not.
    fn flush<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let acker = self.acker.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move { acker.flush().await.py() })
    }

    /// Ends the iteration, hands held nacks to the broker, confirms pending
    /// acks and closes the stream: messages not acked go to other consumers
    /// with their delivery count unchanged. Raises `UnconfirmedError` if
    /// some acks were not confirmed durable.
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.closing.cancel();
        let consumer = self.consumer.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            consumer.lock().await.close().await.py()
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
        self.close(py)
    }

    fn __repr__(&self) -> String {
        format!(
            "Consumer(topic={:?}, subscription={:?}, name={:?})",
            self.topic, self.subscription, self.name
        )
    }
}
