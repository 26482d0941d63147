//! Flipping the pods' http targets and watching what follows: for each flip, when the
//! condition and when the marker showed the new state in an admin's watch of the pods.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::watcher;
use podprobe_ops::backoff::WatchRetry;
use rand::seq::SliceRandom;

use crate::cluster::{CONDITION, CONDITIONS, EXEC_CONDITION, MARKER, NS};
use crate::targets::Targets;

/// One change of a pod's http target and what the pod showed after it.
#[derive(Debug, Clone)]
pub struct Flip {
    pub pod: usize,
    /// The state the target was set to (true: healthy, condition True, marker "true").
    pub to: bool,
    pub at: Timestamp,
    pub condition_seen: Option<Timestamp>,
    pub marker_seen: Option<Timestamp>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    condition: Option<bool>,
    marker: Option<bool>,
    /// How many of the PodProbeMarker's conditions the pod has.
    conditions: usize,
    /// The exec probe's condition, which stays up.
    exec: Option<bool>,
}

#[derive(Debug, Default)]
struct State {
    pods: Vec<Seen>,
    in_flight: HashMap<usize, Flip>,
    done: Vec<Flip>,
}

fn showing(seen: &Seen, healthy: bool, settled: bool) -> bool {
    seen.condition == Some(healthy)
        && seen.marker == Some(healthy)
        && (!settled || seen.conditions == CONDITIONS.len())
}

/// What the watch has seen, shared by the watch task and the driver.
#[derive(Debug, Clone)]
pub struct Tracker {
    state: Arc<Mutex<State>>,
}

fn parse_bool(value: Option<&str>) -> Option<bool> {
    match value? {
        "True" | "true" => Some(true),
        "False" | "false" => Some(false),
        _ => None,
    }
}

impl Tracker {
    /// Starts watching the fleet's pods (as the admin) and returns the tracker.
    pub fn watch(client: kube::Client, pods: usize) -> (Tracker, tokio::task::JoinHandle<()>) {
        let tracker = Tracker {
            state: Arc::new(Mutex::new(State {
                pods: vec![Seen::default(); pods],
                ..State::default()
            })),
        };
        let api: Api<Pod> = Api::namespaced(client, NS);
        let seen = tracker.clone();
        let task = tokio::spawn(async move {
            // The sidecar's own backoff: after an outage this watch comes back within seconds.
            let config = watcher::Config::default().labels("app=fleet");
            let mut events = std::pin::pin!(watcher(api, config).retry_backoff());
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                        seen.observe(&pod)
                    }
                    Ok(_) => {}
                    // The watcher re-lists by itself; a gap only delays what it sees.
                    Err(e) => tracing::warn!("fleet watch: {e}"),
                }
            }
        });
        (tracker, task)
    }

    fn observe(&self, pod: &Pod) {
        let now = Timestamp::now();
        let Some(index) = pod.metadata.name.as_deref().and_then(crate::pods::index_of) else {
            return;
        };
        let all = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
        let condition = parse_bool(
            all.and_then(|c| c.iter().find(|c| c.type_ == CONDITION))
                .map(|c| c.status.as_str()),
        );
        let conditions = all.map_or(0, |c| {
            c.iter()
                .filter(|c| CONDITIONS.contains(&c.type_.as_str()))
                .count()
        });
        let exec = parse_bool(
            all.and_then(|c| c.iter().find(|c| c.type_ == EXEC_CONDITION))
                .map(|c| c.status.as_str()),
        );
        let marker = parse_bool(
            pod.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(MARKER))
                .map(String::as_str),
        );
        let mut state = self.state.lock().unwrap();
        let Some(seen) = state.pods.get_mut(index) else {
            return;
        };
        *seen = Seen {
            condition,
            marker,
            conditions,
            exec,
        };
        let Some(flip) = state.in_flight.get_mut(&index) else {
            return;
        };
        if flip.condition_seen.is_none() && condition == Some(flip.to) {
            flip.condition_seen = Some(now);
        }
        if marker == Some(flip.to) {
            flip.marker_seen = Some(now);
            if let Some(flip) = state.in_flight.remove(&index) {
                state.done.push(flip);
            }
        }
    }

    /// Pods whose flipped condition and marker both show their target's state (and, with
    /// `settled`, which have every condition of the PodProbeMarker).
    pub fn count_showing(&self, targets: &Targets, settled: bool) -> usize {
        let state = self.state.lock().unwrap();
        (0..state.pods.len())
            .filter(|&i| showing(&state.pods[i], targets.is_healthy(i), settled))
            .count()
    }

    /// Pods without a flip in flight that do not show their target's state (or miss a
    /// condition): wrong in a way no lost flip already counts.
    pub fn count_wrong_without_flip(&self, targets: &Targets) -> usize {
        let state = self.state.lock().unwrap();
        (0..state.pods.len())
            .filter(|i| !state.in_flight.contains_key(i))
            .filter(|&i| !showing(&state.pods[i], targets.is_healthy(i), true))
            .count()
    }

    /// Pods whose flipped condition does not show their target's state.
    pub fn count_condition_wrong(&self, targets: &Targets) -> usize {
        let state = self.state.lock().unwrap();
        (0..state.pods.len())
            .filter(|&i| state.pods[i].condition != Some(targets.is_healthy(i)))
            .count()
    }

    /// Pods whose exec probe's condition is not True: its command (`true`) failed, timed out
    /// or could not be run (e.g. its agent did not answer).
    pub fn count_exec_not_true(&self) -> usize {
        let state = self.state.lock().unwrap();
        state.pods.iter().filter(|s| s.exec != Some(true)).count()
    }

    /// Flips whose marker has not shown yet, split by whether their pod's condition already
    /// shows the new state (the marker is late) or not (the result never reached the pod).
    pub fn in_flight_by_condition(&self, targets: &Targets) -> (usize, usize) {
        let state = self.state.lock().unwrap();
        let written = state
            .in_flight
            .keys()
            .filter(|&&i| state.pods[i].condition == Some(targets.is_healthy(i)))
            .count();
        (written, state.in_flight.len() - written)
    }

    pub fn in_flight(&self) -> usize {
        self.state.lock().unwrap().in_flight.len()
    }

    /// Flips done, and flips still waiting for their marker.
    pub fn results(&self) -> (Vec<Flip>, Vec<Flip>) {
        let state = self.state.lock().unwrap();
        (
            state.done.clone(),
            state.in_flight.values().cloned().collect(),
        )
    }
}

/// Every second for `seconds`, flips `percent` % of the pods' targets (at least one pod when
/// `percent` > 0), never a pod whose previous flip has not shown its marker yet. Returns the
/// number of flips made.
pub async fn drive(
    targets: &Targets,
    tracker: &Tracker,
    pods: usize,
    percent: f64,
    seconds: u64,
) -> usize {
    let per_second = if percent > 0.0 {
        ((pods as f64 * percent / 100.0).round() as usize).max(1)
    } else {
        0
    };
    let mut order: Vec<usize> = (0..pods).collect();
    order.shuffle(&mut rand::rng());
    let mut cursor = 0;
    let mut made = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    for _ in 0..seconds {
        tick.tick().await;
        let mut state = tracker.state.lock().unwrap();
        let mut flipped = 0;
        let mut looked = 0;
        while flipped < per_second && looked < pods {
            let pod = order[cursor];
            cursor = (cursor + 1) % pods;
            looked += 1;
            if state.in_flight.contains_key(&pod) {
                continue;
            }
            let to = !targets.is_healthy(pod);
            targets.set_healthy(pod, to);
            state.in_flight.insert(
                pod,
                Flip {
                    pod,
                    to,
                    at: Timestamp::now(),
                    condition_seen: None,
                    marker_seen: None,
                },
            );
            flipped += 1;
        }
        made += flipped;
    }
    made
}
