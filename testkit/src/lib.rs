//! testkit: what podprobe's tests run against, all of it real: etcd, kube-apiserver, a node
//! (kubelet, containerd, runc), kube-controller-manager, the scheduler, kruise-manager,
//! kruise-daemon, OpenKruise Game and the virtual-kubelet library, built from the Go modules
//! pinned under `hack/` ([`real`]); and a fault-injecting proxy in front of the apiserver for
//! what it cannot do on demand ([`real::FaultProxy`], with its rules in [`faults`] and its
//! request log in [`journal`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use testkit::Fault;
//! use testkit::real::{ControlPlane, FaultProxy};
//! let cp = ControlPlane::start().await?;
//! let proxy = FaultProxy::start(&cp).await?;
//! proxy.faults().add(Fault::status(500).method("PATCH").path_contains("/status").times(3));
//! // ... run the code under test against `proxy.url()` ...
//! assert_eq!(proxy.journal().count("PATCH", "pods/status"), 4);
//! # Ok(()) }
//! ```

pub mod child;
pub mod faults;
pub mod journal;
pub mod pod;
pub mod port;
pub mod real;
pub mod rooms;
pub mod wait;
pub mod workspace;

pub use faults::{Action, Fault, Faults};
pub use journal::{Entry, Journal};
