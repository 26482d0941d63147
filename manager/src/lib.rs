//! podprobe-manager: the PodProbeMarker feature for clusters without OpenKruise.
//!
//! PodProbeMarker's pure core is the `podprobe-model` crate, re-exported here under the same
//! names ([`crd`], [`selector`], [`annotate`], [`gojson`], [`markers`], [`validate`],
//! [`patch`]); the kubectl plugin shares it. This crate adds:
//! - [`admission`]: what admission does to a pod (annotations and sidecar), for the webhook
//!   and `render`;
//! - [`config`], [`inject`]: sidecar injection settings and patch;
//! - [`manifest`], [`cli`]: the offline commands.
//!
//! The running parts (`podprobe-manager run`):
//! - [`run`]: flags and wiring ([`run::Manager`]);
//! - [`webhook`] (+ [`tls`]): the HTTPS admission server;
//! - [`cache`]: PodProbeMarker/namespace/node caches;
//! - [`pods`]: markers and annotation propagation, one patch per pod change;
//! - [`status`]: PodProbeMarker status;
//! - [`sidecar_token`]: the token of a sidecar on a virtual node, bound to its pod;
//! - [`leader`]: Lease-based leader election;
//! - [`metrics`]: Prometheus metrics, health and readiness.

pub mod admission;
pub mod cache;
pub mod check;
pub mod cli;
pub mod config;
pub mod events;
pub mod inject;
pub mod leader;
pub mod manifest;
pub mod metrics;
pub mod pods;
pub mod retries;
pub mod routes;
pub mod run;
pub mod sidecar_token;
pub mod status;
pub mod tls;
pub mod webhook;

pub use podprobe_model::{annotate, crd, gojson, markers, patch, selector, validate};

/// Every import between this crate's modules points down: no two rooms (sibling modules, at
/// any floor) import each other, directly or round a circle.
#[cfg(test)]
#[test]
fn every_import_points_down() {
    testkit::rooms::assert_every_import_points_down(env!("CARGO_MANIFEST_DIR"));
}
