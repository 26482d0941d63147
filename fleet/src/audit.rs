//! What the apiserver's audit log says about each flip: which status patch carried the new
//! state and when it was answered (`stageTimestamp` of ResponseComplete), how many status
//! patches and marker writes the pod got before its next flip. Read as a stream: at 10 000
//! pods the log is hundreds of megabytes.

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use testkit::real::AuditEvent;
use testkit::real::virtual_kubelet::VIRTUAL_KUBELET_USER;

use crate::cluster::{CONDITION, NS, SIDECAR_SA};
use crate::flips::Flip;

#[derive(Debug, Clone, Copy)]
enum Write {
    /// A sidecar's status patch, and the flipped condition's status if it carried it.
    Status(Option<bool>),
    /// A write of the pod's metadata by anyone but the admin: the manager's markers.
    Marker,
    /// A status write by a virtual-kubelet node agent (the library's `UpdateStatus`).
    Provider,
}

/// One pod's writes in a window, by writer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteCounts {
    pub sidecar_status: usize,
    pub provider_status: usize,
    pub markers: usize,
}

/// The audit log at `path` and the files the apiserver rotated it into (`audit-<time>.log`
/// beside it, every 100 MB by default), oldest first.
fn audit_files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{stem}-")) && n.ends_with(".log"))
        })
        .collect();
    files.sort();
    files.push(path.to_path_buf());
    Ok(files)
}

/// The sidecars' requests the apiserver finished answering in `[from, to)`, counted by
/// `verb resource[/subresource]`: what an idle fleet asks of the apiserver (nothing should
/// write; a watch ends at most once per pod in a window shorter than its timeout).
pub fn sidecar_requests(
    path: &Path,
    from: Timestamp,
    to: Timestamp,
) -> std::io::Result<BTreeMap<String, usize>> {
    let sidecar = format!("\"system:serviceaccount:{NS}:{SIDECAR_SA}\"");
    let mut counts = BTreeMap::new();
    for file in audit_files(path)? {
        for line in std::io::BufReader::new(std::fs::File::open(file)?).lines() {
            let line = line?;
            if !line.contains(&sidecar) {
                continue;
            }
            let Ok(event) = serde_json::from_str::<AuditEvent>(&line) else {
                continue;
            };
            let Some(at) = event
                .stage_timestamp
                .as_deref()
                .and_then(|t| t.parse::<Timestamp>().ok())
            else {
                continue;
            };
            if at < from || at >= to {
                continue;
            }
            let what = match &event.object_ref {
                Some(o) if o.subresource.is_empty() => format!("{} {}", event.verb, o.resource),
                Some(o) => format!("{} {}/{}", event.verb, o.resource, o.subresource),
                None => format!("{} {}", event.verb, event.request_uri),
            };
            *counts.entry(what).or_insert(0) += 1;
        }
    }
    Ok(counts)
}

/// The sidecars' status patches answered in a window (start-up), set against what they
/// carried: a patch is *a transition* when it was accepted and set at least one condition to a
/// status its pod did not have yet (a first result or a change); every other patch (refused,
/// 429 included, or accepted with nothing new) is one the conditions alone did not need.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StatusPatches {
    pub patches: usize,
    /// Answered with anything but 2xx.
    pub refused: usize,
    /// Answered 429.
    pub throttled: usize,
    pub carrying_a_transition: usize,
    /// Condition transitions written (a patch may carry several).
    pub transitions: usize,
}

impl StatusPatches {
    pub fn beyond_transitions(&self) -> usize {
        self.patches - self.carrying_a_transition
    }
}

/// The sidecars' status patches answered in `[from, to)` ([`StatusPatches`]).
pub fn status_patches(
    path: &Path,
    from: Timestamp,
    to: Timestamp,
) -> std::io::Result<StatusPatches> {
    let sidecar = format!("\"system:serviceaccount:{NS}:{SIDECAR_SA}\"");
    let mut figures = StatusPatches::default();
    let mut known: HashMap<(usize, String), String> = HashMap::new();
    for file in audit_files(path)? {
        for line in std::io::BufReader::new(std::fs::File::open(file)?).lines() {
            let line = line?;
            if !line.contains(&sidecar) || !line.contains("\"patch\"") {
                continue;
            }
            let Ok(event) = serde_json::from_str::<AuditEvent>(&line) else {
                continue;
            };
            let Some(object) = &event.object_ref else {
                continue;
            };
            let Some(pod) = crate::pods::index_of(&object.name) else {
                continue;
            };
            let in_window = event
                .stage_timestamp
                .as_deref()
                .and_then(|t| t.parse::<Timestamp>().ok())
                .is_some_and(|at| at >= from && at < to);
            if object.subresource != "status" || !in_window {
                continue;
            }
            figures.patches += 1;
            if !(200..300).contains(&event.code()) {
                figures.refused += 1;
                figures.throttled += usize::from(event.code() == 429);
                continue;
            }
            let carried = conditions(&event)
                .filter(|(kind, status)| {
                    known.insert((pod, kind.clone()), status.clone()).as_ref() != Some(status)
                })
                .count();
            figures.transitions += carried;
            figures.carrying_a_transition += usize::from(carried > 0);
        }
    }
    Ok(figures)
}

/// Every condition's type and status in a status patch's body.
fn conditions(event: &AuditEvent) -> impl Iterator<Item = (String, String)> + '_ {
    event
        .request_object
        .as_ref()
        .and_then(|o| o["status"]["conditions"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some((
                c["type"].as_str()?.to_owned(),
                c["status"].as_str()?.to_owned(),
            ))
        })
}

/// Per pod index, its successful writes in the order answered.
#[derive(Debug, Default)]
pub struct Writes(HashMap<usize, Vec<(Timestamp, Write)>>);

/// What one flip cost and how long its marker took.
#[derive(Debug, Clone, Copy)]
pub struct FlipCost {
    pub pod: usize,
    pub at: Timestamp,
    pub status_patches: usize,
    pub marker_writes: usize,
    /// When the status patch carrying the new state was answered.
    pub status_answered: Option<Timestamp>,
    /// From that answer to the marker in the watch.
    pub marker_latency_ms: Option<f64>,
}

impl Writes {
    /// Reads the audit log at `path` and the files the apiserver rotated it into.
    pub fn read(path: &Path) -> std::io::Result<Writes> {
        let mut writes = Writes::default();
        for file in audit_files(path)? {
            writes.read_file(&file)?;
        }
        for list in writes.0.values_mut() {
            list.sort_by_key(|(at, _)| *at);
        }
        Ok(writes)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn read_file(&mut self, path: &Path) -> std::io::Result<()> {
        let sidecar = format!("system:serviceaccount:{NS}:{SIDECAR_SA}");
        for line in std::io::BufReader::new(std::fs::File::open(path)?).lines() {
            let line = line?;
            // Cheap filters before parsing: only pod writes in the fleet's namespace.
            if !line.contains("\"fleet-")
                || !(line.contains("\"patch\"") || line.contains("\"update\""))
            {
                continue;
            }
            let Ok(event) = serde_json::from_str::<AuditEvent>(&line) else {
                continue;
            };
            let (Some(object), Some(at)) = (&event.object_ref, &event.stage_timestamp) else {
                continue;
            };
            let Some(index) = crate::pods::index_of(&object.name) else {
                continue;
            };
            if object.resource != "pods" || !(200..300).contains(&event.code()) {
                continue;
            }
            let Ok(at) = at.parse::<Timestamp>() else {
                continue;
            };
            let write = match object.subresource.as_str() {
                "status" if event.user.username == sidecar => Write::Status(condition(&event)),
                "status" if event.user.username == VIRTUAL_KUBELET_USER => Write::Provider,
                "" if event.user.username != "admin" => Write::Marker,
                _ => continue,
            };
            self.0.entry(index).or_default().push((at, write));
        }
        Ok(())
    }

    /// Pod `pod`'s writes from `from` on, one per line (for the bench's diagnostics).
    pub fn describe(&self, pod: usize, from: Timestamp) -> String {
        self.0
            .get(&pod)
            .into_iter()
            .flatten()
            .filter(|(at, _)| *at >= from)
            .map(|(at, write)| format!("  {at} {write:?}\n"))
            .collect()
    }

    /// Pod `pod`'s writes answered in `[from, to)`.
    pub fn counts(&self, pod: usize, from: Timestamp, to: Timestamp) -> WriteCounts {
        let mut counts = WriteCounts::default();
        for (_, write) in self
            .0
            .get(&pod)
            .into_iter()
            .flatten()
            .filter(|(at, _)| *at >= from && *at < to)
        {
            match write {
                Write::Status(_) => counts.sidecar_status += 1,
                Write::Provider => counts.provider_status += 1,
                Write::Marker => counts.markers += 1,
            }
        }
        counts
    }

    /// The cost of each of `flips` (all flips of the run, any order).
    pub fn costs(&self, flips: &[Flip]) -> Vec<FlipCost> {
        let mut by_pod: HashMap<usize, Vec<&Flip>> = HashMap::new();
        for flip in flips {
            by_pod.entry(flip.pod).or_default().push(flip);
        }
        let mut costs = Vec::new();
        for (pod, mut list) in by_pod {
            list.sort_by_key(|f| f.at);
            let writes = self.0.get(&pod).map(Vec::as_slice).unwrap_or_default();
            for (n, flip) in list.iter().enumerate() {
                let end = list.get(n + 1).map(|f| f.at);
                let window = writes
                    .iter()
                    .filter(|(at, _)| *at >= flip.at && end.is_none_or(|end| *at < end));
                let mut cost = FlipCost {
                    pod,
                    at: flip.at,
                    status_patches: 0,
                    marker_writes: 0,
                    status_answered: None,
                    marker_latency_ms: None,
                };
                let mut answered = None;
                for (at, write) in window {
                    match write {
                        Write::Status(state) => {
                            cost.status_patches += 1;
                            if answered.is_none() && *state == Some(flip.to) {
                                answered = Some(*at);
                            }
                        }
                        Write::Marker => cost.marker_writes += 1,
                        Write::Provider => {}
                    }
                }
                cost.status_answered = answered;
                if let (Some(answered), Some(seen)) = (answered, flip.marker_seen) {
                    let ms = seen.duration_since(answered).as_secs_f64() * 1000.0;
                    cost.marker_latency_ms = Some(ms.max(0.0));
                }
                costs.push(cost);
            }
        }
        costs
    }
}

/// The flipped condition's status in a status patch's body.
fn condition(event: &AuditEvent) -> Option<bool> {
    let conditions = event.request_object.as_ref()?["status"]["conditions"].as_array()?;
    let entry = conditions.iter().find(|c| c["type"] == CONDITION)?;
    match entry["status"].as_str()? {
        "True" => Some(true),
        "False" => Some(false),
        _ => None,
    }
}
