//! The `kruise.io/podprobe` protocol, as OpenKruise defines it for serverless nodes and as both
//! podprobe binaries speak it: the sidecar (`podprobe`) reads it, podprobe-manager writes it.
//!
//! - [`annotation`]: the annotation keys, their limits, the wire type of one probe, and its
//!   parsing and per-probe checks into [`handler`]s;
//! - [`check`]: the one check of a probe's handler, read as Kruise's webhook admits it or as
//!   kruise-daemon runs it;
//! - [`event`]: the reasons of the Events the sidecar writes, which the plugin reads back;
//! - [`handler`]: a checked probe's handler, what one attempt runs;
//! - [`rules`]: the field rules a probe must pass (ports, header names, URL paths), each
//!   returning a typed violation whose message is apimachinery's;
//! - [`field`]: field errors, rendered as apimachinery renders them;
//! - [`names`]: Kubernetes qualified names and DNS subdomains;
//! - [`state`]: a probe's state, its pod condition status and its marker policy state;
//! - [`pod`]: which pods still run probes, and the sidecar's field manager;
//! - [`uid_guard`]: how kube-apiserver refuses a patch whose uid guard no longer matches.
//!
//! One home so that the sidecar and the manager can never disagree on a rule: a probe the
//! manager admits is one the sidecar runs.

pub mod annotation;
pub mod check;
pub mod event;
pub mod field;
pub mod handler;
pub mod names;
pub mod pod;
pub mod rules;
pub mod state;
pub mod uid_guard;
