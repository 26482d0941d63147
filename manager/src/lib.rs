//! podprobe-manager: the PodProbeMarker feature for clusters without OpenKruise.
//!
//! This crate's pure core, driven later by kube-runtime controllers and the admission server:
//! - [`crd`]: the `PodProbeMarker` resource and its CRD;
//! - [`annotate`] (+ [`gojson`]): the pod webhook's `kruise.io/podprobe` annotation and patch;
//! - [`validate`]: the PodProbeMarker validating webhook's rules;
//! - [`markers`]: pod conditions → markerPolicy labels/annotations patch;
//! - [`config`], [`inject`]: sidecar injection settings and patch;
//! - [`selector`]: label selectors and which PodProbeMarkers apply to a pod;
//! - [`patch`]: RFC 6902 ops and their conversion for AdmissionReview responses;
//! - [`manifest`], [`cli`]: the offline commands.
//!
//! The running parts (`podprobe-manager run`):
//! - [`run`]: flags and wiring ([`run::Manager`]);
//! - [`webhook`] (+ [`tls`]): the HTTPS admission server;
//! - [`cache`]: PodProbeMarker/namespace/node caches;
//! - [`pods`]: markers and annotation propagation, one patch per pod change;
//! - [`status`]: PodProbeMarker status;
//! - [`leader`]: Lease-based leader election;
//! - [`metrics`]: Prometheus metrics, health and readiness.

pub mod annotate;
pub mod cache;
pub mod check;
pub mod cli;
pub mod config;
pub mod crd;
pub mod gojson;
pub mod inject;
pub mod leader;
pub mod manifest;
pub mod markers;
pub mod metrics;
pub mod patch;
pub mod pods;
pub mod run;
pub mod selector;
pub mod status;
pub mod tls;
pub mod validate;
pub mod webhook;
