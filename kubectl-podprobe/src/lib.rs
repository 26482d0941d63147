//! `kubectl podprobe`: every pod's PodProbeMarker probes, their conditions and markers
//! (`get`), and for one pod the chain from PodProbeMarker to marker with the first link that
//! breaks (`explain`). It reads; it never writes.
//!
//! The rules are not restated here: which probes a pod should carry is podprobe-manager's
//! computation (byte for byte OpenKruise's), whether a probe is valid is the sidecar's own
//! parser, and the state ↔ status ↔ policy mapping is the protocol crate's.

pub mod args;
pub mod explain;
pub mod facts;
pub mod get;
pub mod inspect;
pub mod render;
