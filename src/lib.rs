//! podprobe: runs OpenKruise PodProbeMarker probes from inside a pod.
//!
//! - [`apiserver`]: the sidecar's apiserver client (one HTTP/2 connection, none while idle);
//! - [`annotation`]: reading `kruise.io/podprobe` (whose protocol is the `podprobe-protocol`
//!   crate, shared with the manager) into probes the runner can run;
//! - [`probe`]: one attempt of an exec, tcpSocket, httpGet or grpc probe;
//! - [`runner`]: workers with timing, thresholds and state;
//! - [`condition`]: transitions to pod conditions and the status patch;
//! - [`pod`]: the sidecar's view of its pod (apiserver watch, or downward-API file and status
//!   reads);
//! - [`exec_agent`]: `podprobe agent`, the app container's main process that runs the
//!   sidecar's exec probes inside that container;
//! - [`events`], [`metrics`]: Kubernetes Events and Prometheus metrics;
//! - [`failures`]: how a run of failed apiserver requests is logged;
//! - [`sidecar`], [`check`], `demo`: the `run`, `check` and `demo` commands (`demo` with the
//!   default feature `demo` only; the shipped sidecar leaves it out).

pub mod annotation;
pub mod apiserver;
pub mod check;
pub mod condition;
pub mod credential;
#[cfg(feature = "demo")]
pub mod demo;
pub mod events;
pub mod exec_agent;
pub mod failures;
pub mod metrics;
pub mod pod;
pub mod probe;
pub mod resource_version;
pub mod runner;
pub mod sidecar;

/// Every import between this crate's modules points down: no two rooms (sibling modules, at
/// any floor) import each other, directly or round a circle.
#[cfg(test)]
#[test]
fn every_import_points_down() {
    testkit::rooms::assert_every_import_points_down(env!("CARGO_MANIFEST_DIR"));
}
