//! `kubectl podprobe explain POD`: the chain from PodProbeMarker to marker, link by link, one
//! sentence each, and the first link that breaks.

use podprobe_protocol::annotation::PODPROBE_ANNOTATION;

use crate::facts::{PodFacts, event_time};
use crate::inspect::{self, AnnotationState, Expected, NodeKind, Settings, Sidecar};

/// The sidecar's Event reasons (see the sidecar's `EventReason`).
const OVERWRITTEN: &str = podprobe_protocol::event::CONDITION_OVERWRITTEN;

/// One link of the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub name: &'static str,
    pub ok: bool,
    pub finding: String,
}

fn link(name: &'static str, ok: bool, finding: String) -> Link {
    Link { name, ok, finding }
}

/// Every link, in the order a marker depends on them.
pub fn chain(facts: &PodFacts, settings: &Settings) -> Vec<Link> {
    let expected = inspect::expected(facts);
    let mut links = vec![
        marker_link(facts, &expected),
        annotation_link(facts, &expected),
        probes_link(facts),
        sidecar_link(facts, settings),
    ];
    links.extend(token_link(facts));
    links.push(node_link(facts, settings));
    links.extend(exec_links(facts, settings));
    links.extend(probe_links(facts, &expected));
    links.extend(overwrites_link(facts, settings));
    links
}

fn marker_link(facts: &PodFacts, expected: &Expected) -> Link {
    let pod = &facts.pod;
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    if facts.markers.is_none() {
        return link(
            "PodProbeMarker",
            false,
            "the PodProbeMarker CRD (apps.kruise.io/v1alpha1) is not installed: install OpenKruise or podprobe-manager".into(),
        );
    }
    let names: Vec<&str> = expected
        .markers
        .iter()
        .map(|m| m.metadata.name.as_deref().unwrap_or_default())
        .collect();
    if names.is_empty() {
        let labels: Vec<String> = pod
            .metadata
            .labels
            .iter()
            .flatten()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let how = match inspect::marker_list(pod) {
            Some(list) => {
                format!("its kruise.io/podprobemarker-list names {list:?}, none of which exists")
            }
            None => format!("no selector matches its labels ({})", labels.join(", ")),
        };
        return link(
            "PodProbeMarker",
            false,
            format!("no PodProbeMarker in namespace {namespace} selects the pod: {how}"),
        );
    }
    let by = if inspect::marker_list(pod).is_some() {
        "its kruise.io/podprobemarker-list names"
    } else {
        "selected by"
    };
    let text = format!("{by} PodProbeMarker {}", names.join(", "));
    if expected.annotation.is_none() {
        return link(
            "PodProbeMarker",
            false,
            format!(
                "{text}, but none of their probes applies (each needs a podConditionType and a container of this pod)"
            ),
        );
    }
    link("PodProbeMarker", true, text)
}

fn annotation_link(facts: &PodFacts, expected: &Expected) -> Link {
    let listed = |v: &str| {
        inspect::listed_probes(v)
            .iter()
            .map(|p| format!("{} ({})", p.name, p.condition_type))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let actual = inspect::annotation(&facts.pod, PODPROBE_ANNOTATION).unwrap_or_default();
    match inspect::annotation_state(facts, expected) {
        AnnotationState::Current => link("annotation", true, format!("kruise.io/podprobe lists {}", listed(actual))),
        AnnotationState::Absent => link("annotation", false, "the pod has no kruise.io/podprobe annotation".into()),
        AnnotationState::Missing => link(
            "annotation",
            false,
            "the pod has no kruise.io/podprobe annotation although its PodProbeMarkers give it probes: it was created before them or without the pod webhook (OpenKruise writes the annotation only at creation: recreate the pod; podprobe-manager backfills it)".into(),
        ),
        AnnotationState::OutOfDate => link(
            "annotation",
            false,
            format!(
                "kruise.io/podprobe is out of date with its PodProbeMarkers ({}): OpenKruise never updates it, recreate the pod; podprobe-manager rewrites it",
                differences(actual, expected.annotation.as_deref().unwrap_or_default())
            ),
        ),
        AnnotationState::Unowned => link(
            "annotation",
            true,
            format!("kruise.io/podprobe lists {} (no PodProbeMarker gives them: written by hand or left by a deleted one)", listed(actual)),
        ),
    }
}

/// Which probes of `actual` differ from `wanted`, by condition type.
fn differences(actual: &str, wanted: &str) -> String {
    let entries = |v: &str| -> Vec<(String, serde_json::Value)> {
        let list: Vec<serde_json::Value> = serde_json::from_str(v).unwrap_or_default();
        list.into_iter()
            .map(|e| {
                (
                    e["podConditionType"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    e,
                )
            })
            .collect()
    };
    let (actual, wanted) = (entries(actual), entries(wanted));
    let find = |list: &[(String, serde_json::Value)], ct: &str| {
        list.iter().find(|(c, _)| c == ct).map(|(_, e)| e.clone())
    };
    let name = |e: &serde_json::Value| e["name"].as_str().unwrap_or_default().to_owned();
    let mut found = Vec::new();
    for (ct, entry) in &wanted {
        match find(&actual, ct) {
            None => found.push(format!("probe {} ({ct}) added", name(entry))),
            Some(old) if &old != entry => {
                found.push(format!("probe {} ({ct}) changed", name(entry)))
            }
            Some(_) => {}
        }
    }
    for (ct, entry) in &actual {
        if find(&wanted, ct).is_none() {
            found.push(format!("probe {} ({ct}) removed", name(entry)));
        }
    }
    if found.is_empty() {
        found.push("same probes, other order or bytes".into());
    }
    found.join(", ")
}

fn probes_link(facts: &PodFacts) -> Link {
    let invalid = inspect::invalid_probes(&facts.pod);
    if invalid.is_empty() {
        return link("probes", true, "every probe is valid".into());
    }
    let why: Vec<String> = invalid.iter().map(ToString::to_string).collect();
    link(
        "probes",
        false,
        format!("the sidecar refuses {}", why.join("; ")),
    )
}

fn sidecar_link(facts: &PodFacts, settings: &Settings) -> Link {
    let name = &settings.sidecar_container;
    match inspect::sidecar(&facts.pod, name) {
        Sidecar::Ready => match inspect::node_kind(facts, settings) {
            NodeKind::Regular(node) if stands_down_off_virtual_nodes(&facts.pod, name) => link(
                "sidecar",
                true,
                format!(
                    "container {name} is ready and stands down on node {node}, which is not a virtual node: kruise-daemon probes this pod there (companion mode, one executor per pod)"
                ),
            ),
            _ => link("sidecar", true, format!("container {name} is ready")),
        },
        Sidecar::Missing => link(
            "sidecar",
            false,
            format!(
                "the pod has no {name} container: nothing runs its probes (with podprobe-manager, label the namespace podprobe.io/inject=enabled and recreate the pod)"
            ),
        ),
        Sidecar::NotReady(why) => link(
            "sidecar",
            false,
            format!("container {name} is not ready ({why})"),
        ),
    }
}

/// The label by which podprobe-manager tracks a virtual-node sidecar's token.
const TOKEN_LABEL: &str = "podprobe.io/sidecar-token";
/// The prefix of the Secrets podprobe-manager issues virtual-node sidecars' tokens into.
const TOKEN_SECRET_PREFIX: &str = "podprobe-token-";

/// Where a virtual-node sidecar's token stands: `None` for a pod that has no issued token
/// and is not labelled (the kubelet projects its token).
fn token_link(facts: &PodFacts) -> Option<Link> {
    let labels = facts.pod.metadata.labels.as_ref();
    let state = labels.and_then(|l| l.get(TOKEN_LABEL)).map(String::as_str);
    let secret = facts
        .pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.secret.as_ref()?.secret_name.as_deref())
        .find(|n| n.starts_with(TOKEN_SECRET_PREFIX));
    let (ok, finding) = match (state, secret) {
        (Some("pending"), _) => (
            false,
            format!(
                "the pod waits, unscheduled, behind the scheduling gate {TOKEN_LABEL} until podprobe-manager issues its sidecar's token (are its replicas running? `podprobe-manager release-gates` lifts the gate by hand)"
            ),
        ),
        (Some("refused"), _) => (
            false,
            "the pod was released without its sidecar's token (label podprobe.io/sidecar-token=refused): its sidecar cannot reach the apiserver; its Event SidecarTokenNotIssued says why".into(),
        ),
        (Some("projected"), _) => (
            true,
            "the pod keeps its projected service-account token (bound at creation, or automountServiceAccountToken: true), which a virtual node's provider may drop or replace: if no condition comes, that is why".into(),
        ),
        (_, Some(secret)) => (
            true,
            format!(
                "the sidecar's token was issued by podprobe-manager into Secret {secret}, bound to this pod; the sidecar renews it itself"
            ),
        ),
        (Some(other), None) => (
            false,
            format!("label {TOKEN_LABEL}={other}, which podprobe-manager does not write"),
        ),
        (None, None) => return None,
    };
    Some(link("token", ok, finding))
}

fn node_link(facts: &PodFacts, settings: &Settings) -> Link {
    let (key, value) = &settings.serverless_label;
    match inspect::node_kind(facts, settings) {
        NodeKind::Serverless(n) => {
            link("node", true, format!("node {n} is labelled {key}={value}"))
        }
        NodeKind::Unscheduled => link("node", false, "the pod is not scheduled yet".into()),
        NodeKind::Unknown(n) => link("node", false, format!("node {n} does not exist")),
        // Not a broken link: whether the node's pods get markers is unknown, so the chain
        // goes on to the markers themselves, which tell.
        NodeKind::Unreadable(n, why) => link(
            "node",
            true,
            format!("node {n} not checked: your credentials may not read it ({why})"),
        ),
        NodeKind::Regular(n) => link(
            "node",
            false,
            format!(
                "node {n} is not labelled {key}={value}: the managers write markers only for pods of serverless nodes (kruise-daemon probes pods of other nodes)"
            ),
        ),
    }
}

/// The command podprobe's injection runs a wrapped container's command with, or starts the
/// agent beside a container's entrypoint with (its postStart hook).
const AGENT_BINARY: &str = "/podprobe-agent/podprobe";

/// Whether `command` is podprobe's exec agent.
fn runs_agent(command: &[String]) -> bool {
    command.first().map(String::as_str) == Some(AGENT_BINARY)
        && command.get(1).map(String::as_str) == Some("agent")
}
/// The pod annotation by which a pod opts out of the exec agent (podprobe-manager's).
const EXEC_AGENT_OPT_OUT: &str = "podprobe.io/exec-agent";

/// Per container that exec probes target: where their command runs, and what it costs. Never
/// a broken link: every path runs the probes. None without podprobe's sidecar: podprobe runs
/// none of the pod's probes then, and the sidecar link says what is missing.
fn exec_links(facts: &PodFacts, settings: &Settings) -> Vec<Link> {
    let on_virtual_node = matches!(inspect::node_kind(facts, settings), NodeKind::Serverless(_));
    let pod = &facts.pod;
    if matches!(
        inspect::sidecar(pod, &settings.sidecar_container),
        Sidecar::Missing
    ) {
        return vec![];
    }
    let mut targets: Vec<String> = inspect::annotation(pod, PODPROBE_ANNOTATION)
        .map(inspect::listed_probes)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.exec)
        .map(|p| p.container)
        .collect();
    targets.sort();
    targets.dedup();
    let Some(spec) = pod.spec.as_ref() else {
        return vec![];
    };
    let opted_out = inspect::annotation(pod, EXEC_AGENT_OPT_OUT) == Some("disabled");
    targets
        .into_iter()
        .filter_map(|name| {
            let container = spec.containers.iter().find(|c| c.name == name)?;
            let command = container.command.as_deref().unwrap_or_default();
            let post_start = container.lifecycle.as_ref().and_then(|l| l.post_start.as_ref());
            let hook = post_start.and_then(|h| h.exec.as_ref()).and_then(|e| e.command.as_deref());
            // `agent --detach` as a command would return at once: only the hook's is an agent.
            let detaches = command.iter().take_while(|a| *a != "--").any(|a| a == "--detach");
            let finding = if runs_agent(command) && !detaches {
                format!("exec probes on container {name} run inside it through podprobe's exec agent, its main process (no apiserver request per attempt)")
            } else if hook.is_some_and(runs_agent) {
                format!("exec probes on container {name} run inside it through podprobe's exec agent, started beside its image's entrypoint by its postStart hook (no apiserver request per attempt)")
            } else if opted_out {
                format!("exec probes on container {name} go through pods/exec (an apiserver request per attempt): the pod opts out of podprobe's exec agent ({EXEC_AGENT_OPT_OUT}: disabled)")
            } else if spec.share_process_namespace == Some(true) {
                format!("exec probes on container {name} run from the sidecar in the container's root (procfs) when the sidecar may (root, the runtime's capabilities), else through pods/exec (an apiserver request and a kubelet exec per attempt)")
            } else if on_virtual_node && command.is_empty() {
                format!("exec probes on container {name} go through pods/exec, the provider's exec (an apiserver request per attempt; azure-aci's reports no exit status, so they read success whatever the command does): the container gives no command, so injection could not run it under podprobe's exec agent; give it its command (the image's ENTRYPOINT and CMD) and recreate the pod")
            } else if on_virtual_node {
                format!("exec probes on container {name} go through pods/exec, the provider's exec (an apiserver request per attempt; azure-aci's reports no exit status, so they read success whatever the command does): the pod was not injected with the exec agent (execAgent kubeletNodes or disabled, or created before podprobe-manager); recreate it to get the agent")
            } else if command.is_empty() && post_start.is_some() {
                format!("exec probes on container {name} go through pods/exec (an apiserver request and a kubelet exec per attempt): the container gives no command and has a postStart hook of its own, so injection could neither run it under podprobe's exec agent nor start the agent beside it; give it its command (the image's ENTRYPOINT and CMD) and recreate the pod")
            } else {
                format!("exec probes on container {name} go through pods/exec (an apiserver request and a kubelet exec per attempt): the pod was not injected with the exec agent (execAgent disabled, or created before podprobe-manager); recreate it to get the agent")
            };
            Some(link("exec", true, finding))
        })
        .collect()
}

/// Per probe of the annotation: its condition, its policy for that state, its markers.
fn probe_links(facts: &PodFacts, expected: &Expected) -> Vec<Link> {
    let pod = &facts.pod;
    let listed = inspect::annotation(pod, PODPROBE_ANNOTATION)
        .map(inspect::listed_probes)
        .unwrap_or_default();
    let mut links = Vec::new();
    for probe in listed {
        let ct = &probe.condition_type;
        let Some(condition) = inspect::condition(pod, ct) else {
            let finding = match overwritten(facts, ct) {
                Some(note) => {
                    format!("condition {ct} is missing: another writer removed it ({note})")
                }
                None => format!("condition {ct} is missing: the sidecar has not written it"),
            };
            links.push(link("condition", false, finding));
            continue;
        };
        let message = condition.message.as_deref().unwrap_or_default();
        let ok = condition.status == "True";
        let state = if ok { "succeeds" } else { "does not succeed" };
        links.push(link(
            "condition",
            ok,
            format!(
                "condition {ct} is {} ({message:?}): probe {} {state}",
                condition.status, probe.name
            ),
        ));
        let Some((marker, policies)) = inspect::policies(expected, ct) else {
            continue;
        };
        let Some(policy) = inspect::policy_for(policies, &condition.status) else {
            links.push(link(
                "policy",
                false,
                format!("PodProbeMarker {marker} has no markerPolicy for state {} of probe {}: nothing is written for it", podprobe_protocol::state::ProbeState::of_condition_status(&condition.status).as_str(), probe.name),
            ));
            continue;
        };
        let keys = inspect::marker_keys(pod, policy);
        let missing: Vec<&str> = keys
            .iter()
            .filter(|(_, on)| !on)
            .map(|(k, _)| k.as_str())
            .collect();
        let all: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
        if missing.is_empty() {
            links.push(link(
                "markers",
                true,
                format!(
                    "the {} policy's markers are on the pod: {}",
                    policy.state,
                    all.join(", ")
                ),
            ));
        } else {
            let verb = if missing.len() == 1 { "is" } else { "are" };
            links.push(link(
                "markers",
                false,
                format!(
                    "the {} policy's {} {verb} not on the pod: is the manager (kruise-manager or podprobe-manager) running?",
                    policy.state,
                    missing.join(", ")
                ),
            ));
        }
    }
    links
}

/// Another writer keeps removing or changing the pod's conditions: how often the sidecar
/// reported it, who else writes the pod's status (managedFields), and what to do. Not a broken
/// link: markers follow the probes either way, since a missing condition changes no marker.
fn overwrites_link(facts: &PodFacts, settings: &Settings) -> Option<Link> {
    let reported: Vec<_> = facts
        .events
        .iter()
        .filter(|e| e.reason.as_deref() == Some(OVERWRITTEN))
        .collect();
    let last = reported.last()?;
    let count: i64 = reported
        .iter()
        .map(|e| i64::from(e.count.unwrap_or(1).max(1)))
        .sum();
    let since = reported
        .iter()
        .filter_map(|e| {
            e.first_timestamp
                .as_ref()
                .map(|t| t.0)
                .or_else(|| event_time(e))
        })
        .min()
        .map(|t| inspect::human_age(inspect::age(settings.now, t)))
        .unwrap_or_else(|| "?".into());
    let writers = status_writers(&facts.pod, settings.now);
    let writers = if writers.is_empty() {
        "managedFields name no other writer of the status".to_owned()
    } else {
        format!("the status is also written by {}", writers.join(", "))
    };
    let repair = match repair_policy(&facts.pod, &settings.sidecar_container).as_deref() {
        Some("immediate") => "--overwrite-repair immediate, as injected for virtual nodes: each at once, at most one write per condition per second; each overwrite costs a write, and the provider's next copy another (docs/providers.md)".to_owned(),
        Some("backoff") => "--overwrite-repair backoff: the first at once, then 1 s … 1 m apart while overwrites go on); where a provider replaces the whole status every few seconds, --overwrite-repair=immediate keeps them present at one write per overwrite (docs/providers.md".to_owned(),
        _ => "--overwrite-repair after-change, the default: at once for 30 s after a probe's result changed, so the managers see each change, then 1 s … 1 m apart while overwrites go on); where a provider replaces the whole status every few seconds, --overwrite-repair=immediate keeps them present at one write per overwrite (docs/providers.md".to_owned(),
    };
    Some(link(
        "overwrites",
        true,
        format!(
            "conditions overwritten: {count} {OVERWRITTEN} Event(s) in the last {since} (the sidecar publishes at most one per condition per 10m; its metric podprobe_condition_overwrites_total counts each), the last: {:?}; {writers}. The sidecar writes them back ({repair})",
            last.message.as_deref().unwrap_or_default()
        ),
    ))
}

/// The sidecar container's `--overwrite-repair` as its pod spec sets it: the flag (which wins),
/// else `PODPROBE_OVERWRITE_REPAIR`; `None`: the sidecar's default.
fn repair_policy(pod: &k8s_openapi::api::core::v1::Pod, sidecar: &str) -> Option<String> {
    let container = container(pod, sidecar)?;
    let words: Vec<&str> = container
        .command
        .iter()
        .chain(container.args.iter())
        .flatten()
        .map(String::as_str)
        .collect();
    let flag = words.iter().enumerate().find_map(|(i, w)| {
        w.strip_prefix("--overwrite-repair=").or_else(|| {
            (*w == "--overwrite-repair")
                .then(|| words.get(i + 1).copied())
                .flatten()
        })
    });
    let env = || {
        let env = container.env.iter().flatten();
        env.filter(|e| e.name == "PODPROBE_OVERWRITE_REPAIR")
            .find_map(|e| e.value.as_deref())
    };
    flag.or_else(env).map(str::to_owned)
}

/// Whether the sidecar container was told `--only-on-virtual-nodes` (flag or env), as
/// injection in companion mode does.
fn stands_down_off_virtual_nodes(pod: &k8s_openapi::api::core::v1::Pod, sidecar: &str) -> bool {
    let Some(container) = container(pod, sidecar) else {
        return false;
    };
    let flag = container
        .command
        .iter()
        .chain(container.args.iter())
        .flatten()
        .any(|w| w == "--only-on-virtual-nodes" || w == "--only-on-virtual-nodes=true");
    let env =
        container.env.iter().flatten().any(|e| {
            e.name == "PODPROBE_ONLY_ON_VIRTUAL_NODES" && e.value.as_deref() == Some("true")
        });
    flag || env
}

fn container<'a>(
    pod: &'a k8s_openapi::api::core::v1::Pod,
    name: &str,
) -> Option<&'a k8s_openapi::api::core::v1::Container> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
}

/// The field managers other than podprobe's that wrote the pod's status, newest first, each
/// with its operation and how long ago.
fn status_writers(pod: &k8s_openapi::api::core::v1::Pod, now: jiff::Timestamp) -> Vec<String> {
    let mut writers: Vec<_> = pod
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.subresource.as_deref() == Some("status"))
        .filter(|m| m.manager.as_deref() != Some(podprobe_protocol::pod::FIELD_MANAGER))
        .collect();
    writers.sort_by_key(|m| std::cmp::Reverse(m.time.as_ref().map(|t| t.0)));
    writers
        .iter()
        .map(|m| {
            let age = m
                .time
                .as_ref()
                .map(|t| format!(", {} ago", inspect::human_age(inspect::age(now, t.0))))
                .unwrap_or_default();
            format!(
                "{} ({}{age})",
                m.manager.as_deref().unwrap_or("?"),
                m.operation.as_deref().unwrap_or("?")
            )
        })
        .collect()
}

/// The newest `PodProbeConditionOverwritten` Event for `condition_type`, as a note.
fn overwritten(facts: &PodFacts, condition_type: &str) -> Option<String> {
    facts
        .events
        .iter()
        .rev()
        .filter(|e| e.reason.as_deref() == Some(OVERWRITTEN))
        .find(|e| {
            e.message
                .as_deref()
                .is_some_and(|m| m.contains(condition_type))
        })
        .map(|e| {
            format!(
                "Event {OVERWRITTEN}: {}",
                e.message.as_deref().unwrap_or_default()
            )
        })
}

/// The events about the pod, as `explain` lists them.
pub fn event_lines(facts: &PodFacts, settings: &Settings) -> Vec<String> {
    facts
        .events
        .iter()
        .map(|e| {
            let age = event_time(e)
                .map(|t| inspect::human_age(inspect::age(settings.now, t)))
                .unwrap_or_else(|| "?".into());
            format!(
                "{age} ago\t{}\t{}\t{}",
                e.type_.as_deref().unwrap_or_default(),
                e.reason.as_deref().unwrap_or_default(),
                e.message.as_deref().unwrap_or_default()
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::{Event, Pod};
    use serde_json::json;

    use super::*;
    use crate::facts::Unread;

    fn settings(now: &str) -> Settings {
        Settings {
            sidecar_container: "podprobe".into(),
            serverless_label: ("type".into(), "virtual-kubelet".into()),
            refresh_interval: Duration::from_secs(600),
            now: now.parse().unwrap(),
        }
    }

    /// A pod whose status podprobe, the node agent and the kubelet-less scheduler wrote.
    fn facts(events: Vec<Event>) -> PodFacts {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "gs-0",
            "managedFields": [
                {"manager": "podprobe", "operation": "Update", "subresource": "status",
                 "time": "2026-11-25T12:59:00Z"},
                {"manager": "vk-replacer", "operation": "Update", "subresource": "status",
                 "time": "2026-11-25T12:59:57Z"},
                {"manager": "kube-scheduler", "operation": "Update", "subresource": "status",
                 "time": "2026-11-25T12:00:00Z"},
                {"manager": "kruise-manager", "operation": "Update",
                 "time": "2026-11-25T12:59:58Z"}]}}))
        .unwrap();
        PodFacts {
            pod,
            markers: None,
            node: None,
            events,
            unread: Unread::default(),
        }
    }

    fn overwritten_event(first: &str, last: &str, count: i32) -> Event {
        serde_json::from_value(json!({"metadata": {"name": "e"},
            "involvedObject": {}, "reason": OVERWRITTEN, "type": "Warning", "count": count,
            "firstTimestamp": first, "lastTimestamp": last,
            "message": "another writer (vk-replacer) removed or changed condition game.io/idle; podprobe writes it back"}))
        .unwrap()
    }

    #[test]
    fn overwrites_say_how_often_who_else_writes_the_status_and_what_to_do() {
        let events = vec![
            overwritten_event("2026-11-25T12:30:00Z", "2026-11-25T12:30:00Z", 1),
            overwritten_event("2026-11-25T12:40:00Z", "2026-11-25T12:50:00Z", 2),
        ];
        let link = overwrites_link(&facts(events), &settings("2026-11-25T13:00:00Z")).unwrap();
        assert_eq!(link.name, "overwrites");
        assert!(link.ok, "markers follow either way: not a broken link");
        let f = &link.finding;
        assert!(
            f.contains("3 PodProbeConditionOverwritten Event(s) in the last 30m"),
            "{f}"
        );
        assert!(
            f.contains("another writer (vk-replacer) removed or changed condition game.io/idle"),
            "{f}"
        );
        // Status writers only, newest first, podprobe's own left out.
        assert!(
            f.contains("the status is also written by vk-replacer (Update, 3s ago), kube-scheduler (Update, 60m ago)."),
            "{f}"
        );
        assert!(
            f.contains("--overwrite-repair after-change, the default"),
            "{f}"
        );
        assert!(f.contains("--overwrite-repair=immediate"), "{f}");
    }

    #[test]
    fn overwrites_name_the_repair_policy_the_sidecar_runs_with() {
        let events = vec![overwritten_event(
            "2026-11-25T12:30:00Z",
            "2026-11-25T12:30:00Z",
            1,
        )];
        let with = |sidecar: serde_json::Value| {
            let mut f = facts(events.clone());
            f.pod.spec = Some(
                serde_json::from_value(json!({"containers": [{"name": "main"}, sidecar]})).unwrap(),
            );
            overwrites_link(&f, &settings("2026-11-25T13:00:00Z"))
                .unwrap()
                .finding
        };
        // As injected for a virtual node.
        let injected = with(json!({"name": "podprobe",
            "env": [{"name": "PODPROBE_OVERWRITE_REPAIR", "value": "immediate"}]}));
        assert!(
            injected.contains("--overwrite-repair immediate, as injected for virtual nodes"),
            "{injected}"
        );
        assert!(!injected.contains("the default"), "{injected}");
        // The flag wins over the env, as the sidecar's own parsing has it.
        let args = with(
            json!({"name": "podprobe", "args": ["run", "--overwrite-repair", "backoff"],
            "env": [{"name": "PODPROBE_OVERWRITE_REPAIR", "value": "immediate"}]}),
        );
        assert!(args.contains("--overwrite-repair backoff:"), "{args}");
        let equals =
            with(json!({"name": "podprobe", "args": ["run", "--overwrite-repair=backoff"]}));
        assert!(equals.contains("--overwrite-repair backoff:"), "{equals}");
        let default = with(json!({"name": "podprobe"}));
        assert!(default.contains("after-change, the default"), "{default}");
    }

    #[test]
    fn the_token_link_says_where_a_virtual_node_sidecars_token_stands() {
        let with = |label: Option<&str>, secret: Option<&str>| {
            let mut f = facts(Vec::new());
            f.pod.metadata.labels = label.map(|v| [(TOKEN_LABEL.to_owned(), v.to_owned())].into());
            let volumes: Vec<_> = secret
                .map(|s| json!({"name": "podprobe-api-access", "secret": {"secretName": s}}))
                .into_iter()
                .collect();
            f.pod.spec = Some(
                serde_json::from_value(json!({"containers": [{"name": "main"}],
                                             "volumes": volumes}))
                .unwrap(),
            );
            token_link(&f).map(|l| (l.ok, l.finding))
        };
        assert_eq!(with(None, None), None, "a kubelet node's pod");
        let (ok, f) = with(Some("pending"), Some("podprobe-token-abc")).unwrap();
        assert!(!ok && f.contains("scheduling gate"), "{f}");
        let (ok, f) = with(Some("refused"), Some("podprobe-token-abc")).unwrap();
        assert!(!ok && f.contains("SidecarTokenNotIssued"), "{f}");
        let (ok, f) = with(Some("projected"), None).unwrap();
        assert!(ok && f.contains("projected service-account token"), "{f}");
        let (ok, f) = with(None, Some("podprobe-token-abc")).unwrap();
        assert!(ok && f.contains("Secret podprobe-token-abc"), "{f}");
        let (ok, f) = with(Some("odd"), None).unwrap();
        assert!(!ok && f.contains("odd"), "{f}");
    }

    #[test]
    fn exec_says_where_each_containers_probes_run() {
        let probes = r#"[{"name":"idle","containerName":"agent","podConditionType":"a/idle","probe":{"exec":{"command":["/idle.sh"]}}},
            {"name":"up","containerName":"plain","podConditionType":"a/up","probe":{"exec":{"command":["true"]}}},
            {"name":"near","containerName":"beside","podConditionType":"a/near","probe":{"exec":{"command":["true"]}}},
            {"name":"old","containerName":"late","podConditionType":"a/old","probe":{"exec":{"command":["true"]}}},
            {"name":"tcp","containerName":"tcp","podConditionType":"a/tcp","probe":{"tcpSocket":{"port":1}}}]"#;
        let mut f = facts(Vec::new());
        f.pod.metadata.annotations =
            Some([(PODPROBE_ANNOTATION.to_owned(), probes.to_owned())].into());
        f.pod.spec = Some(
            serde_json::from_value(json!({"containers": [
                {"name": "agent", "command": [AGENT_BINARY, "agent", "--socket", "/podprobe-agent/agent.sock", "--", "/srv", "--detach"]},
                {"name": "plain", "lifecycle": {"postStart": {"exec": {"command": ["/warm-up"]}}}},
                {"name": "beside", "lifecycle": {"postStart": {"exec": {"command": [AGENT_BINARY, "agent", "--socket", "/podprobe-agent-socket/agent.sock", "--detach"]}}}},
                {"name": "late"}, {"name": "tcp"}, {"name": "podprobe"}]}))
            .unwrap(),
        );
        let settings = settings("2026-11-25T13:00:00Z");
        assert_eq!(settings.sidecar_container, "podprobe");
        let links = exec_links(&f, &settings);
        assert_eq!(links.len(), 4, "{links:?}");
        assert!(links.iter().all(|l| l.ok && l.name == "exec"));
        assert!(
            links[0]
                .finding
                .contains("container agent run inside it through podprobe's exec agent"),
            "{links:?}"
        );
        assert!(
            links[1].finding.contains(
                "container beside run inside it through podprobe's exec agent, started beside"
            ),
            "{links:?}"
        );
        assert!(
            links[2]
                .finding
                .contains("container late go through pods/exec")
                && links[2]
                    .finding
                    .contains("not injected with the exec agent"),
            "{links:?}"
        );
        assert!(
            links[3]
                .finding
                .contains("container plain go through pods/exec")
                && links[3].finding.contains("postStart hook of its own"),
            "{links:?}"
        );
        // Opted out, the plain container says so instead of asking for a command.
        let annotations = f.pod.metadata.annotations.as_mut().unwrap();
        annotations.insert(EXEC_AGENT_OPT_OUT.to_owned(), "disabled".to_owned());
        let links = exec_links(&f, &settings);
        assert!(
            links[3]
                .finding
                .contains("opts out of podprobe's exec agent"),
            "{links:?}"
        );
        // Without podprobe's sidecar something else runs the probes: no exec line.
        let spec = f.pod.spec.as_mut().unwrap();
        spec.containers.retain(|c| c.name != "podprobe");
        assert_eq!(exec_links(&f, &settings), Vec::new());
    }

    #[test]
    fn a_sidecar_told_to_stand_down_on_a_kubelet_node_says_kruise_daemon_probes() {
        let on = |node_labels: serde_json::Value, env: serde_json::Value| {
            let mut f = facts(Vec::new());
            f.pod = serde_json::from_value(json!({"metadata": {"name": "gs-0"},
                "spec": {"nodeName": "node-1", "containers": [{"name": "main"},
                    {"name": "podprobe", "env": env}]},
                "status": {"containerStatuses": [{"name": "podprobe", "ready": true,
                    "image": "", "imageID": "", "restartCount": 0}]}}))
            .unwrap();
            f.node = Some(
                serde_json::from_value(
                    json!({"metadata": {"name": "node-1", "labels": node_labels}}),
                )
                .unwrap(),
            );
            sidecar_link(&f, &settings("2026-11-25T13:00:00Z"))
        };
        let told = json!([{"name": "PODPROBE_ONLY_ON_VIRTUAL_NODES", "value": "true"}]);
        let kubelet = on(json!({}), told.clone());
        assert!(
            kubelet.ok && kubelet.finding.contains("stands down on node node-1"),
            "{kubelet:?}"
        );
        let virtual_node = on(json!({"type": "virtual-kubelet"}), told);
        assert_eq!(virtual_node.finding, "container podprobe is ready");
        let standalone = on(json!({}), json!([]));
        assert_eq!(standalone.finding, "container podprobe is ready");
    }

    #[test]
    fn no_overwrite_reported_no_line() {
        assert_eq!(
            overwrites_link(&facts(Vec::new()), &settings("2026-11-25T13:00:00Z")),
            None
        );
    }
}
