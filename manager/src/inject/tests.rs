//! Injection as a whole: the ops applied to pods of each kind, and what the pod ends up with.

use super::*;
use crate::config::NativeSidecar;
use k8s_openapi::api::core::v1::{ExecAction, Lifecycle, LifecycleHandler, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn config() -> InjectionConfig {
    InjectionConfig::from_yaml("image: podprobe:dev\n", "t").unwrap()
}

fn pod(pod_labels: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("p".into()),
            labels: Some(labels(pod_labels)),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

fn applied(pod: &Pod, ops: &[PatchOp]) -> Pod {
    let mut doc = serde_json::to_value(pod).unwrap();
    crate::patch::apply(&mut doc, ops).unwrap();
    serde_json::from_value(doc).unwrap()
}

const ENABLED: &[(&str, &str)] = &[("podprobe.io/inject", "enabled")];

/// Each env var's name and its field path, or its value.
fn env_of(c: &Container) -> Vec<(&str, &str)> {
    let env = c.env.iter().flatten();
    env.map(|e| {
        let field = e.value_from.as_ref().and_then(|v| v.field_ref.as_ref());
        let shown = field.map_or(e.value.as_deref().unwrap_or(""), |f| &f.field_path);
        (e.name.as_str(), shown)
    })
    .collect()
}

#[test]
fn opt_in_by_pod_or_namespace_and_opt_out_by_pod() {
    let c = config();
    let ns = labels(ENABLED);
    assert!(opted_in(&pod(ENABLED).metadata, &c, None));
    assert!(!opted_in(&pod(&[]).metadata, &c, None));
    assert!(opted_in(&pod(&[]).metadata, &c, Some(&ns)));
    assert!(!opted_in(
        &pod(&[("podprobe.io/inject", "disabled")]).metadata,
        &c,
        Some(&ns)
    ));
    let ctx = InjectContext::default();
    assert!(inject_ops(&pod(&[]), &c, &ctx).is_empty());
}

#[test]
fn in_companion_mode_the_sidecar_learns_its_node_and_probes_only_on_virtual_nodes() {
    let p = pod(ENABLED);
    for companion in [false, true] {
        let ctx = InjectContext {
            native_sidecars_supported: true,
            companion,
            ..Default::default()
        };
        let out = applied(&p, &inject_ops(&p, &config(), &ctx));
        let sidecar = &out.spec.unwrap().init_containers.unwrap()[0];
        let env = env_of(sidecar);
        let told = env.contains(&("NODE_NAME", "spec.nodeName"))
            && env.contains(&("PODPROBE_ONLY_ON_VIRTUAL_NODES", "true"));
        assert_eq!(told, companion, "{env:?}");
    }
}

#[test]
fn native_sidecar_with_env_volume_and_security_context() {
    let ctx = InjectContext {
        native_sidecars_supported: true,
        ..Default::default()
    };
    let p = pod(ENABLED);
    let out = applied(&p, &inject_ops(&p, &config(), &ctx));
    let spec = out.spec.unwrap();
    assert_eq!(spec.containers.len(), 1);
    let sidecar = &spec.init_containers.unwrap()[0];
    assert_eq!(sidecar.name, "podprobe");
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
    assert_eq!(
        sidecar.command.as_deref(),
        Some(&["/usr/local/bin/podprobe".to_owned()][..])
    );
    assert_eq!(
        env_of(sidecar),
        [
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
            ("POD_UID", "metadata.uid"),
            ("POD_IP", "status.podIP"),
            ("PODPROBE_SOURCE", "file"),
        ]
    );
    let mount = &sidecar.volume_mounts.as_ref().unwrap()[0];
    assert_eq!(
        (mount.mount_path.as_str(), mount.read_only),
        ("/etc/podinfo", Some(true))
    );
    let volumes = spec.volumes.unwrap();
    let volume = volumes.iter().find(|v| v.name == mount.name).unwrap();
    let item = &volume
        .downward_api
        .as_ref()
        .unwrap()
        .items
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        (
            item.path.as_str(),
            item.field_ref.as_ref().unwrap().field_path.as_str()
        ),
        ("annotations", "metadata.annotations")
    );
    assert_eq!(
        sidecar.security_context.as_ref().unwrap().run_as_non_root,
        Some(true)
    );
    assert!(spec.readiness_gates.is_none());
    assert!(sidecar.ports.is_none(), "no metrics port unless configured");
}

#[test]
fn a_pod_for_a_virtual_node_gets_the_shape_providers_accept() {
    let ctx = InjectContext {
        native_sidecars_supported: true,
        ..Default::default()
    };
    let mut p = with_generated_token(pod(ENABLED), None);
    p.spec.as_mut().unwrap().tolerations = Some(vec![
        serde_json::from_value(
            serde_json::json!({"key": "virtual-kubelet.io/provider", "operator": "Exists"}),
        )
        .unwrap(),
    ]);
    let spec = applied(&p, &inject_ops(&p, &config(), &ctx)).spec.unwrap();
    // A plain container, even where native sidecars are supported.
    let inits = spec.init_containers.unwrap();
    assert!(inits.iter().all(|c| c.name != "podprobe"), "{inits:?}");
    let sidecar = spec
        .containers
        .iter()
        .find(|c| c.name == "podprobe")
        .unwrap();
    assert_eq!(
        sidecar.command.as_deref(),
        Some(&[crate::config::DEFAULT_COMMAND.to_owned()][..])
    );
    assert_eq!(
        env_of(sidecar),
        [
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
            ("POD_UID", "metadata.uid"),
            ("PODPROBE_SOURCE", "api"),
            ("PODPROBE_OVERWRITE_REPAIR", "immediate"),
            ("PODPROBE_RENEW_TOKEN_DIR", token::RENEWAL_MOUNT_PATH),
        ]
    );
    // The issued token, and where the sidecar keeps it renewed.
    assert_eq!(
        mounts(sidecar),
        [
            (sidecar_token::TOKEN_VOLUME, token::TOKEN_MOUNT_PATH),
            (token::RENEWAL_VOLUME, token::RENEWAL_MOUNT_PATH)
        ]
    );
    let volumes = spec.volumes.unwrap();
    let names: Vec<_> = volumes.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "own-token",
            sidecar_token::TOKEN_VOLUME,
            token::RENEWAL_VOLUME
        ]
    );
    let renewal = volumes[2].empty_dir.as_ref().unwrap();
    assert_eq!(renewal.medium.as_deref(), Some("Memory"));
    // The issued Secret is optional: a pod released without one still starts.
    let sources = volumes[1]
        .projected
        .as_ref()
        .unwrap()
        .sources
        .as_ref()
        .unwrap();
    let secret = sources.iter().find_map(|s| s.secret.as_ref()).unwrap();
    assert_eq!(secret.optional, Some(true));
    assert!(sources.iter().all(|s| s.service_account_token.is_none()));
}

#[test]
fn metrics_port_opts_the_sidecar_into_serving_metrics() {
    let c = InjectionConfig::from_yaml("image: podprobe:dev\nmetricsPort: 9102\n", "t").unwrap();
    let sidecar = sidecar_container(&c, Shape::Kubelet, false);
    let addr = sidecar
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "PODPROBE_METRICS_ADDR")
        .and_then(|e| e.value.as_deref());
    assert_eq!(addr, Some("0.0.0.0:9102"));
    let port = &sidecar.ports.as_ref().unwrap()[0];
    assert_eq!(
        (port.name.as_deref(), port.container_port),
        (Some(SIDECAR_METRICS_PORT_NAME), 9102)
    );
    // Kubernetes refuses port names over 15 characters (IANA service names).
    assert!(SIDECAR_METRICS_PORT_NAME.len() <= 15);
}

#[test]
fn plain_container_when_cluster_lacks_native_sidecars_and_appends_to_existing_arrays() {
    let mut p = pod(ENABLED);
    let spec = p.spec.as_mut().unwrap();
    spec.init_containers = Some(vec![Container {
        name: "init".into(),
        ..Default::default()
    }]);
    spec.volumes = Some(vec![Volume {
        name: "data".into(),
        ..Default::default()
    }]);
    let ctx = InjectContext::default();
    let out = applied(&p, &inject_ops(&p, &config(), &ctx)).spec.unwrap();
    assert_eq!(out.containers[1].name, "podprobe");
    assert_eq!(out.containers[1].restart_policy, None);
    assert_eq!(out.init_containers.unwrap().len(), 1);
    let volumes: Vec<String> = out.volumes.unwrap().into_iter().map(|v| v.name).collect();
    assert_eq!(volumes, ["data", "podprobe-api-access", "podprobe-podinfo"]);

    let mut c = config();
    c.native_sidecar = NativeSidecar::Always;
    let out = applied(&p, &inject_ops(&p, &c, &ctx)).spec.unwrap();
    let inits: Vec<String> = out
        .init_containers
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(inits, ["init", "podprobe"]);
}

/// The condition types an injected pod's spec gates readiness on, in order.
fn gate_types(spec: PodSpec) -> Vec<String> {
    let gates = spec.readiness_gates.unwrap_or_default();
    gates.into_iter().map(|g| g.condition_type).collect()
}

#[test]
fn readiness_gates_only_for_chosen_conditions_the_pod_probes() {
    let types = vec!["game.io/healthy".to_string(), "game.io/idle".to_string()];
    let ctx = InjectContext {
        probe_condition_types: &types,
        ..Default::default()
    };
    let mut c = config();
    c.readiness_gates = vec!["game.io/healthy".into(), "game.io/absent".into()];
    let mut p = pod(ENABLED);
    let out = applied(&p, &inject_ops(&p, &c, &ctx)).spec.unwrap();
    let gates = gate_types(out);
    assert_eq!(gates, ["game.io/healthy"]);

    c.readiness_gates = vec!["*".into()];
    p.spec.as_mut().unwrap().readiness_gates = Some(vec![PodReadinessGate {
        condition_type: "game.io/idle".into(),
    }]);
    let out = applied(&p, &inject_ops(&p, &c, &ctx)).spec.unwrap();
    let gates = gate_types(out);
    assert_eq!(gates, ["game.io/idle", "game.io/healthy"]);
}

#[test]
fn already_injected_pod_is_left_alone_and_process_namespace_is_shared_on_request() {
    let mut c = config();
    c.share_process_namespace = true;
    let ctx = InjectContext::default();
    let p = pod(ENABLED);
    let ops = inject_ops(&p, &c, &ctx);
    assert!(ops.contains(&PatchOp::Add {
        path: "/spec/shareProcessNamespace".into(),
        value: Value::Bool(true)
    }));
    let injected = applied(&p, &ops);
    assert!(inject_ops(&injected, &c, &ctx).is_empty());
}

fn with_command(mut p: Pod, command: Option<&[&str]>) -> Pod {
    let main = &mut p.spec.as_mut().unwrap().containers[0];
    main.command = command.map(|c| c.iter().map(|s| s.to_string()).collect());
    main.args = Some(vec!["7777".into()]);
    p
}

fn find<'a>(containers: &'a [Container], name: &str) -> &'a Container {
    containers.iter().find(|c| c.name == name).unwrap()
}

#[test]
fn a_container_with_its_own_termination_message_path_has_the_agent_write_there() {
    let exec = vec!["main".to_string()];
    let ctx = InjectContext {
        native_sidecars_supported: true,
        exec_probe_containers: &exec,
        ..Default::default()
    };
    let mut p = with_command(pod(ENABLED), Some(&["/server"]));
    p.spec.as_mut().unwrap().containers[0].termination_message_path = Some("/why".into());
    let spec = applied(&p, &inject_ops(&p, &config(), &ctx)).spec.unwrap();
    let command = spec.containers[0].command.clone().unwrap();
    assert_eq!(
        command[2..],
        [
            "--socket",
            "/podprobe-agent-socket/agent.sock",
            "--termination-log",
            "/why",
            "--",
            "/server"
        ]
    );
}

#[test]
fn the_container_exec_probes_target_runs_its_command_under_the_agent() {
    let exec = vec!["main".to_string()];
    let ctx = InjectContext {
        native_sidecars_supported: true,
        exec_probe_containers: &exec,
        ..Default::default()
    };
    let p = with_command(pod(ENABLED), Some(&["/server", "--port"]));
    let spec = applied(&p, &inject_ops(&p, &config(), &ctx)).spec.unwrap();
    let main = &spec.containers[0];
    assert_eq!(
        main.command.as_deref().unwrap(),
        [
            agent::AGENT_BINARY,
            "agent",
            "--socket",
            "/podprobe-agent-socket/agent.sock",
            "--",
            "/server",
            "--port"
        ]
    );
    assert_eq!(main.args.as_deref().unwrap(), ["7777"]);
    // Each agent mount of a container: (volume, path, read-only).
    let mounted = |c: &Container| -> Vec<(String, String, bool)> {
        let mounts = c.volume_mounts.iter().flatten();
        let mounts = mounts.filter(|m| m.name.starts_with(agent::AGENT_VOLUME));
        let seen = |m: &VolumeMount| {
            let read_only = m.read_only.unwrap_or(false);
            (m.name.clone(), m.mount_path.clone(), read_only)
        };
        mounts.map(seen).collect()
    };
    let binary = || (agent::AGENT_VOLUME.to_owned(), agent::AGENT_DIR.to_owned());
    let socket = "podprobe-agent-socket-0".to_owned();
    assert_eq!(
        mounted(main),
        [
            (binary().0, binary().1, true),
            (socket.clone(), agent::SOCKET_DIR.into(), false)
        ]
    );
    let inits = spec.init_containers.unwrap();
    let names: Vec<_> = inits.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, [agent::INSTALL_CONTAINER, "podprobe"]);
    let install = &inits[0];
    assert_eq!(
        install.command.as_deref().unwrap(),
        [
            crate::config::DEFAULT_COMMAND,
            "install-agent",
            agent::AGENT_BINARY
        ]
    );
    assert_eq!(install.security_context, Some(config().security_context));
    assert_eq!(install.restart_policy, None);
    assert_eq!(mounted(install), [(binary().0, binary().1, false)]);
    assert!(install.resources.is_some());
    // The sidecar reaches the socket alone, not the binary.
    let sidecar = &inits[1];
    let in_sidecar = (socket.clone(), "/podprobe-agent/main".to_owned(), true);
    assert_eq!(mounted(sidecar), [in_sidecar]);
    assert!(env_of(sidecar).contains(&(agent::AGENTS_ENV, "main")));
    let volumes = spec.volumes.unwrap();
    for name in [agent::AGENT_VOLUME, &socket] {
        let volume = volumes.iter().find(|v| v.name == name).unwrap();
        assert!(volume.empty_dir.is_some());
    }
}

#[test]
fn no_agent_without_an_exec_probe_or_when_disabled_or_opted_out() {
    let exec = vec!["main".to_string()];
    let none: Vec<String> = vec![];
    let ctx = |exec_probe_containers| InjectContext {
        exec_probe_containers,
        ..Default::default()
    };
    let mut disabled = config();
    disabled.exec_agent = crate::config::ExecAgentChoice::Disabled;
    let with = with_command(pod(ENABLED), Some(&["/server"]));
    let without = with_command(pod(ENABLED), None);
    let mut taken = with.clone();
    taken.spec.as_mut().unwrap().volumes = Some(vec![Volume {
        name: "podprobe-agent".into(),
        ..Default::default()
    }]);
    let mut opted_out = with.clone();
    opted_out.metadata.annotations = Some(
        [(agent::OPT_OUT_ANNOTATION.to_owned(), "disabled".to_owned())]
            .into_iter()
            .collect(),
    );
    for (p, c, ctx) in [
        (&without, disabled.clone(), ctx(&exec)),
        (&with, config(), ctx(&none)),
        (&with, disabled, ctx(&exec)),
        (&taken, config(), ctx(&exec)),
        (&opted_out, config(), ctx(&exec)),
    ] {
        let spec = applied(p, &inject_ops(p, &c, &ctx)).spec.unwrap();
        let main = &spec.containers[0];
        assert_eq!(main.command, p.spec.as_ref().unwrap().containers[0].command);
        assert!(main.volume_mounts.is_none());
        let sidecar = find(&spec.containers, "podprobe");
        assert!(!env_of(sidecar).iter().any(|(n, _)| *n == agent::AGENTS_ENV));
        let volumes = spec.volumes.iter().flatten();
        let theirs = p.spec.as_ref().unwrap().volumes.iter().flatten().count();
        let agents = volumes.filter(|v| v.name.starts_with(agent::AGENT_VOLUME));
        assert_eq!(agents.count(), theirs);
    }
}

/// A container that runs its image's entrypoint: its postStart hook starts the agent beside
/// it, on kubelet nodes; not on a virtual node, nor beside a postStart hook of its own.
#[test]
fn without_a_command_the_agent_starts_beside_the_entrypoint_on_kubelet_nodes_only() {
    let exec = vec!["main".to_string()];
    let ctx = InjectContext {
        exec_probe_containers: &exec,
        ..Default::default()
    };
    let without = with_command(pod(ENABLED), None);
    let beside = [
        agent::AGENT_BINARY,
        "agent",
        "--socket",
        "/podprobe-agent-socket/agent.sock",
        "--detach",
    ];
    let hook_of = |c: &Container| {
        let hook = c.lifecycle.as_ref()?.post_start.as_ref()?;
        hook.exec.as_ref()?.command.clone()
    };
    let spec = applied(&without, &inject_ops(&without, &config(), &ctx));
    let main = &spec.spec.as_ref().unwrap().containers[0];
    assert_eq!(main.command, None);
    assert_eq!(
        hook_of(main).as_deref(),
        Some(&beside.map(String::from)[..])
    );
    let mounts: Vec<_> = main
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| &m.mount_path)
        .collect();
    assert_eq!(mounts, [agent::AGENT_DIR, agent::SOCKET_DIR]);
    let sidecar = find(&spec.spec.as_ref().unwrap().containers, "podprobe");
    assert!(env_of(sidecar).contains(&(agent::AGENTS_ENV, "main")));
    // Admitted again (a webhook reinvocation): nothing more.
    assert!(agent::plan(&spec, &config(), &exec, false).ops.is_empty());

    // A preStop hook stays; the postStart hook is added beside it.
    let mut stopping = without.clone();
    stopping.spec.as_mut().unwrap().containers[0].lifecycle = Some(Lifecycle {
        pre_stop: Some(LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(vec!["/drain".into()]),
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let spec = applied(&stopping, &inject_ops(&stopping, &config(), &ctx))
        .spec
        .unwrap();
    let lifecycle = spec.containers[0].lifecycle.as_ref().unwrap();
    assert!(lifecycle.pre_stop.is_some());
    assert_eq!(
        hook_of(&spec.containers[0]).as_deref(),
        Some(&beside.map(String::from)[..])
    );

    // Its own postStart hook, or a virtual node: left, and why.
    let mut own_hook = stopping.clone();
    let lifecycle = own_hook.spec.as_mut().unwrap().containers[0]
        .lifecycle
        .as_mut()
        .unwrap();
    lifecycle.post_start = lifecycle.pre_stop.take();
    let mut on_virtual = without.clone();
    on_virtual.spec.as_mut().unwrap().node_selector = Some(labels(&[("type", "virtual-kubelet")]));
    for (p, why) in [
        (&own_hook, "postStart hook of its own"),
        (&on_virtual, "virtual node"),
    ] {
        let spec = applied(p, &inject_ops(p, &config(), &ctx)).spec.unwrap();
        assert_eq!(
            spec.containers[0].lifecycle,
            p.spec.as_ref().unwrap().containers[0].lifecycle
        );
        assert!(spec.containers[0].volume_mounts.is_none());
        let virtual_node = std::ptr::eq(p, &on_virtual);
        let plan = agent::plan(p, &config(), &exec, virtual_node);
        assert!(
            matches!(&plan.decisions[..], [agent::Decision::Left { why: w, .. }] if w.contains(why)),
            "{:?}",
            plan.decisions
        );
    }
}

#[test]
fn on_a_virtual_node_auto_wraps_unless_kubelet_nodes_only_and_the_install_container_has_no_resources()
 {
    let exec = vec!["main".to_string()];
    let ctx = InjectContext {
        exec_probe_containers: &exec,
        ..Default::default()
    };
    let mut p = with_command(pod(ENABLED), Some(&["/server"]));
    p.spec.as_mut().unwrap().node_selector = Some(labels(&[("type", "virtual-kubelet")]));
    let mut kubelet_nodes = config();
    kubelet_nodes.exec_agent = crate::config::ExecAgentChoice::KubeletNodes;
    let spec = applied(&p, &inject_ops(&p, &kubelet_nodes, &ctx))
        .spec
        .unwrap();
    assert_eq!(spec.containers[0].command.as_deref().unwrap(), ["/server"]);
    assert!(spec.init_containers.is_none());
    let mut always = config();
    always.exec_agent = crate::config::ExecAgentChoice::Always;
    for config in [config(), always] {
        let spec = applied(&p, &inject_ops(&p, &config, &ctx)).spec.unwrap();
        let install = find(
            spec.init_containers.as_deref().unwrap(),
            agent::INSTALL_CONTAINER,
        );
        assert_eq!(install.resources, None);
        assert_eq!(install.ports, None);
        assert_eq!(
            spec.containers[0].command.as_deref().unwrap()[0],
            agent::AGENT_BINARY
        );
        let sidecar = find(&spec.containers, "podprobe");
        assert!(env_of(sidecar).contains(&(agent::AGENTS_ENV, "main")));
    }
}

#[test]
fn a_virtual_node_pod_whose_exec_probes_take_pods_exec_is_warned_a_kubelet_pod_is_not() {
    let exec = vec!["main".to_string()];
    let ctx = InjectContext {
        exec_probe_containers: &exec,
        ..Default::default()
    };
    let on_virtual = |command: Option<&[&str]>| {
        let mut p = with_command(pod(ENABLED), command);
        p.spec.as_mut().unwrap().node_selector = Some(labels(&[("type", "virtual-kubelet")]));
        p
    };
    let warned = inject(&on_virtual(None), &config(), &ctx).warnings;
    assert!(
        matches!(&warned[..], [w] if w.contains("\"main\"") && w.contains("pods/exec")
            && w.contains("no command in the pod spec")),
        "{warned:?}"
    );
    // Wrapped by the agent, or on a kubelet node (beside the entrypoint): no warning.
    let wrapped = inject(&on_virtual(Some(&["/server"])), &config(), &ctx);
    assert!(wrapped.warnings.is_empty(), "{:?}", wrapped.warnings);
    let kubelet = inject(&with_command(pod(ENABLED), None), &config(), &ctx);
    assert!(kubelet.warnings.is_empty(), "{:?}", kubelet.warnings);
}

/// What kube-apiserver's ServiceAccount plugin adds before the webhook.
fn with_generated_token(mut p: Pod, automount: Option<bool>) -> Pod {
    let spec = p.spec.as_mut().unwrap();
    spec.automount_service_account_token = automount;
    let generated = serde_json::json!({"name": "kube-api-access-x7k2p", "projected": {
        "sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}});
    let own = serde_json::json!({"name": "own-token", "secret": {"secretName": "s"}});
    spec.volumes = Some(vec![
        serde_json::from_value(own).unwrap(),
        serde_json::from_value(generated).unwrap(),
    ]);
    let mount = |name: &str, path: &str| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(true),
        ..Default::default()
    };
    spec.containers[0].volume_mounts = Some(vec![
        mount("own-token", "/etc/own"),
        mount("kube-api-access-x7k2p", token::TOKEN_MOUNT_PATH),
    ]);
    spec.init_containers = Some(vec![Container {
        name: "init".into(),
        volume_mounts: Some(vec![mount(
            "kube-api-access-x7k2p",
            token::TOKEN_MOUNT_PATH,
        )]),
        ..Default::default()
    }]);
    p
}

fn mounts(c: &Container) -> Vec<(&str, &str)> {
    let mounts = c.volume_mounts.iter().flatten();
    mounts
        .map(|m| (m.name.as_str(), m.mount_path.as_str()))
        .collect()
}

#[test]
fn the_token_is_mounted_in_the_sidecar_only() {
    let ctx = InjectContext {
        native_sidecars_supported: true,
        ..Default::default()
    };
    for automount in [None, Some(false)] {
        let p = with_generated_token(pod(ENABLED), automount);
        let spec = applied(&p, &inject_ops(&p, &config(), &ctx)).spec.unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(mounts(&spec.containers[0]), [("own-token", "/etc/own")]);
        let inits = spec.init_containers.unwrap();
        assert_eq!(mounts(&inits[0]), []);
        assert_eq!(
            mounts(&inits[1]),
            [
                ("podprobe-podinfo", "/etc/podinfo"),
                (sidecar_token::TOKEN_VOLUME, token::TOKEN_MOUNT_PATH)
            ]
        );
        let volumes: Vec<_> = spec.volumes.unwrap().into_iter().map(|v| v.name).collect();
        assert_eq!(
            volumes,
            ["own-token", sidecar_token::TOKEN_VOLUME, "podprobe-podinfo"]
        );
    }
}

#[test]
fn a_pod_that_asks_for_the_token_everywhere_keeps_it() {
    let ctx = InjectContext::default();
    let p = with_generated_token(pod(ENABLED), Some(true));
    let spec = applied(&p, &inject_ops(&p, &config(), &ctx)).spec.unwrap();
    assert_eq!(spec.automount_service_account_token, Some(true));
    assert_eq!(
        mounts(&spec.containers[0])[1],
        ("kube-api-access-x7k2p", token::TOKEN_MOUNT_PATH)
    );
    let volumes: Vec<_> = spec.volumes.unwrap().into_iter().map(|v| v.name).collect();
    assert_eq!(
        volumes,
        ["own-token", "kube-api-access-x7k2p", "podprobe-podinfo"]
    );
}

/// What the issuer reads back from what injection wrote: the Secret, the pending label, the
/// gate, and a release that undoes exactly that.
mod with_the_issuer {
    use super::*;
    use crate::sidecar_token::decide::{issued_secret, release_patch};
    use crate::sidecar_token::{GATE, ISSUER_LABEL, LABEL, PENDING, PROJECTED, REFUSED};
    use kube::api::Patch;
    use serde_json::json;

    fn injected_virtual_pod() -> Pod {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "games", "uid": "u-1",
                         "labels": {"podprobe.io/inject": "enabled"}},
            "spec": {"serviceAccountName": "podprobe-sidecar",
                     "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                     "schedulingGates": [{"name": "other.io/gate"}],
                     "containers": [{"name": "main", "image": "game"}]}
        }))
        .unwrap();
        let ctx = InjectContext {
            request_uid: "9f0c1e2d-aaaa-bbbb-cccc-000000000001",
            issuer: "manager-0",
            ..Default::default()
        };
        applied(&pod, &inject_ops(&pod, &config(), &ctx))
    }

    fn gates(pod: &Pod) -> Vec<&str> {
        let spec = pod.spec.as_ref().unwrap();
        let gates = spec.scheduling_gates.iter().flatten();
        gates.map(|g| g.name.as_str()).collect()
    }

    fn released(pod: &Pod, uid: &str, label: Value) -> Result<Pod, json_patch::PatchError> {
        let Patch::Json(patch) = release_patch(pod, uid, label) else {
            unreachable!()
        };
        let mut doc = serde_json::to_value(pod).unwrap();
        json_patch::patch(&mut doc, &patch)?;
        Ok(serde_json::from_value(doc).unwrap())
    }

    #[test]
    fn injection_names_the_secret_holds_the_pod_and_release_undoes_only_that() {
        let pod = injected_virtual_pod();
        assert_eq!(
            issued_secret(&pod).as_deref(),
            Some("podprobe-token-9f0c1e2daaaabbbbcccc000000000001")
        );
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get(LABEL).map(String::as_str), Some(PENDING));
        let issuer = labels.get(ISSUER_LABEL).map(String::as_str);
        assert_eq!(issuer, Some("manager-0"), "the replica that admitted it");
        assert_eq!(gates(&pod), ["other.io/gate", GATE]);

        let out = released(&pod, "u-1", Value::Null).unwrap();
        assert_eq!(gates(&out), ["other.io/gate"]);
        assert!(!out.metadata.labels.unwrap().contains_key(LABEL));

        // A same-named replacement (another uid) is left alone.
        assert!(released(&pod, "u-2", Value::String(REFUSED.into())).is_err());
    }

    #[test]
    fn a_virtual_node_pod_that_keeps_the_projected_token_says_so_and_why() {
        let bound: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "labels": {"podprobe.io/inject": "enabled"}},
            "spec": {"nodeName": "vk-1",
                     "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                     "containers": [{"name": "main"}]}
        }))
        .unwrap();
        let mut automount = bound.clone();
        let spec = automount.spec.as_mut().unwrap();
        spec.node_name = None;
        spec.automount_service_account_token = Some(true);
        automount.metadata.labels = None;
        // The second opted in by its namespace, without labels of its own.
        let namespace = labels(ENABLED);
        let ctx = InjectContext {
            namespace_labels: Some(&namespace),
            ..Default::default()
        };
        for (pod, why) in [
            (&bound, "spec.nodeName"),
            (&automount, "automountServiceAccountToken"),
        ] {
            let injected = inject(pod, &config(), &ctx);
            let out = applied(pod, &injected.ops);
            assert_eq!(issued_secret(&out), None);
            assert!(out.spec.as_ref().unwrap().scheduling_gates.is_none());
            let label = out.metadata.labels.as_ref().unwrap().get(LABEL);
            assert_eq!(label.map(String::as_str), Some(PROJECTED), "{why}");
            assert_eq!(injected.warnings.len(), 1, "{why}");
            assert!(
                injected.warnings[0].contains(why),
                "{}",
                injected.warnings[0]
            );
        }

        // An unbound pod gets an issued token, and no warning.
        let mut unbound = bound.clone();
        unbound.spec.as_mut().unwrap().node_name = None;
        let injected = inject(&unbound, &config(), &InjectContext::default());
        assert!(injected.warnings.is_empty(), "{:?}", injected.warnings);
    }
}
