//! What the writer holds between patches: the newest write per condition type, pending or
//! parked, and when each type was last queued and written.

use std::collections::{BTreeMap, BTreeSet};

use tokio::time::Instant;

use super::{ConditionWrite, WriteProgress};
use crate::resource_version::ResourceVersion;

pub(super) type Writes = BTreeMap<String, ConditionWrite>;

/// An accepted patch, as the writer remembers it for each condition type it carried.
#[derive(Debug, Clone)]
pub(super) struct Landed {
    /// When its answer came back.
    pub(super) at: Instant,
    /// The pod's resourceVersion in the answer: the first version that shows the write.
    pub(super) version: Option<ResourceVersion>,
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) pending: Writes,
    /// Writes the apiserver refused as invalid (422) on their own: retried after a backoff,
    /// apart from the others, so one refused condition never holds back the rest. A newer
    /// write of the same type replaces a parked one.
    pub(super) parked: Writes,
    /// Types of the patch on the wire.
    pub(super) in_flight: BTreeSet<String>,
    /// When the last write of each type was queued.
    pub(super) queued_at: BTreeMap<String, Instant>,
    /// The last accepted patch of each type.
    pub(super) written: BTreeMap<String, Landed>,
    /// A write-back is pending: the next patch goes without the coalescing window.
    pub(super) urgent: bool,
}

impl State {
    /// What the next patch carries: everything pending, or one write while isolating.
    ///
    /// Sets and deletes never share a patch: the chart's admission policy lets the sidecar
    /// remove only condition types its annotation still declares, so a prune can be refused,
    /// and a refused delete must not hold back a result. Sets go first.
    pub(super) fn take_batch(&mut self, isolate: bool) -> Vec<ConditionWrite> {
        let deletes = self.pending.values().all(ConditionWrite::is_delete);
        let kinds: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, w)| w.is_delete() == deletes)
            .map(|(kind, _)| kind.clone())
            .take(if isolate { 1 } else { usize::MAX })
            .collect();
        let batch: Vec<ConditionWrite> = kinds
            .iter()
            .filter_map(|kind| self.pending.remove(kind))
            .collect();
        self.urgent = false;
        self.in_flight = batch
            .iter()
            .map(|w| w.condition_type().to_owned())
            .collect();
        batch
    }

    pub(super) fn queue(&mut self, write: ConditionWrite) {
        let kind = write.condition_type().to_owned();
        self.queued_at.insert(kind.clone(), Instant::now());
        self.parked.remove(&kind);
        self.pending.insert(kind, write);
    }

    /// `batch` was accepted; `version` is the pod's resourceVersion in the answer. An answer
    /// without one replaces the version of an earlier write too: that one would date views
    /// against the wrong write.
    pub(super) fn landed(&mut self, batch: &[ConditionWrite], version: Option<ResourceVersion>) {
        let landed = Landed {
            at: Instant::now(),
            version,
        };
        for write in batch {
            self.written
                .insert(write.condition_type().to_owned(), landed.clone());
        }
        self.in_flight.clear();
    }

    /// What the writer is doing with `condition_type`.
    pub(super) fn progress(&self, condition_type: &str) -> WriteProgress {
        let written = self.written.get(condition_type);
        WriteProgress {
            busy: self.pending.contains_key(condition_type)
                || self.parked.contains_key(condition_type)
                || self.in_flight.contains(condition_type),
            queued_at: self.queued_at.get(condition_type).copied(),
            written_at: written.map(|w| w.at),
            written_rv: written.and_then(|w| w.version.clone()),
        }
    }

    /// Sets a refused batch aside; anything pending was submitted after it and wins over it.
    pub(super) fn park(&mut self, refused: Vec<ConditionWrite>) {
        let pending = std::mem::take(&mut self.pending);
        requeue(&mut self.parked, refused);
        for (kind, write) in pending {
            self.parked.remove(&kind);
            self.pending.insert(kind, write);
        }
        self.in_flight.clear();
    }

    /// Parked writes are due again, unless a newer one of the same type is pending.
    pub(super) fn unpark(&mut self) {
        for (kind, write) in std::mem::take(&mut self.parked) {
            self.pending.entry(kind).or_insert(write);
        }
    }
}

/// Puts a failed batch back, except where a newer condition of the same type arrived meanwhile.
pub(super) fn requeue(into: &mut Writes, batch: Vec<ConditionWrite>) {
    for write in batch {
        into.entry(write.condition_type().to_owned())
            .or_insert(write);
    }
}
