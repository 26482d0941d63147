//! What the sidecar and the manager serve to operators, one implementation for both:
//!
//! - [`endpoints`]: `/metrics` (OpenMetrics text), `/healthz` and `/readyz` on a plain HTTP
//!   listener that outlives accept errors and shuts down gracefully;
//! - [`process`]: the standard `process_*` metrics and `build_info`, registered by both;
//! - [`connection`]: one HTTP/1 connection served until it ends or shutdown (the manager's
//!   webhooks use it too);
//! - [`backoff`]: how they wait after a failed request to the apiserver (watches, controllers,
//!   status writes);
//! - [`entry`]: logging from `--log-level`/`--log-format`, and the signal that ends them;
//! - [`token`]: the pod-bound TokenRequest (the manager's issue, the sidecar's renewal).

pub mod backoff;
pub mod connection;
pub mod endpoints;
pub mod entry;
pub mod process;
pub mod token;
