//! `ricochet._native`, the extension module behind the `ricochet` Python
//! package: thin PyO3 wrappers over `ricochet-client` (connections,
//! producers, consumers with their settle methods, messages) and
//! `ricochet-policy` (policy specs and their schedules), awaitable from
//! asyncio through `pyo3-async-runtimes` on its tokio runtime. All failure
//! handling — policies, nack and ack-timeout trackers, reconnect backoff,
//! redirects, receipts — is the Rust client's; this crate only converts
//! arguments, results and errors.

mod client;
mod consumer;
mod convert;
mod errors;
mod message;
mod policy;
mod producer;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<client::PyClient>()?;
    m.add_class::<producer::PyProducer>()?;
    m.add_class::<consumer::PyConsumer>()?;
    m.add_class::<message::PyMessage>()?;
    m.add_class::<message::PyMessageId>()?;
    m.add_class::<policy::PyPolicySchedule>()?;
    m.add_class::<policy::PyScheduleRow>()?;
    m.add_function(wrap_pyfunction!(policy::explain_policy, m)?)?;
    m.add_function(wrap_pyfunction!(policy::parse_policy, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
