//! podprobe: runs OpenKruise PodProbeMarker probes from inside a pod.
//!
//! - [`annotation`]: the `kruise.io/podprobe` protocol, parsing and validation;
//! - [`probe`]: one attempt of an exec, tcpSocket, httpGet or grpc probe;
//! - [`runner`]: workers with timing, thresholds and state;
//! - [`condition`]: transitions to pod conditions and the status patch;
//! - [`check`], [`demo`]: the `podprobe check` and `podprobe demo` commands.

pub mod annotation;
pub mod check;
pub mod condition;
pub mod demo;
pub mod probe;
pub mod runner;
