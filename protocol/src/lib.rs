//! The `kruise.io/podprobe` protocol, as OpenKruise defines it for serverless nodes and as both
//! podprobe binaries speak it: the sidecar (`podprobe`) reads it, podprobe-manager writes it.
//!
//! - [`annotation`]: the annotation keys, their limits and the wire type of one probe;
//! - [`rules`]: the field rules a probe must pass (ports, header names, URL paths), each
//!   returning a typed violation whose message is apimachinery's;
//! - [`names`]: Kubernetes qualified names and DNS subdomains;
//! - [`state`]: a probe's state, its pod condition status and its marker policy state;
//! - [`pod`]: which pods still run probes;
//! - [`uid_guard`]: how kube-apiserver refuses a patch whose uid guard no longer matches.
//!
//! One home so that the sidecar and the manager can never disagree on a rule: a probe the
//! manager admits is one the sidecar runs.

pub mod annotation;
pub mod names;
pub mod pod;
pub mod rules;
pub mod state;
pub mod uid_guard;
