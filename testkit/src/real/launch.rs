//! Starting etcd and kube-apiserver: the certificates, tokens and flags of a test control
//! plane.

use std::net::Ipv4Addr;

use super::process::Daemon;
use super::{
    ADMIN_TOKEN, ControlPlane, Error, KUBE_PROXY_TOKEN, KUBERNETES_SERVICE_NAMES, NODE_NAME,
    NODE_TOKEN, Pki, ServiceRange, VIRTUAL_NODE_TOKEN, audit, free_port, pki, tools,
};

impl ControlPlane {
    pub(super) async fn start_once(
        address: Ipv4Addr,
        apiserver: &str,
        flags: &[&str],
    ) -> Result<ControlPlane, Error> {
        let apiserver_bin = tools::tool(apiserver)?;
        let etcd_bin = tools::tool("etcd")?;
        let dir = tempfile::Builder::new().prefix("podprobe-cp-").tempdir()?;
        let path = |name: &str| dir.path().join(name);
        let pki = Pki::new()?;
        std::fs::write(path("ca.crt"), pki.ca_pem())?;
        let address_name = address.to_string();
        let services = ServiceRange::of_apiserver(address);
        let kubernetes_ip = services.kubernetes_ip().to_string();
        let mut names = vec![
            "127.0.0.1",
            "localhost",
            address_name.as_str(),
            kubernetes_ip.as_str(),
        ];
        names.extend(KUBERNETES_SERVICE_NAMES);
        let serving = pki.issue(&names)?;
        std::fs::write(path("apiserver.crt"), &serving.cert_pem)?;
        std::fs::write(path("apiserver.key"), &serving.key_pem)?;
        // The apiserver's identity towards kubelets (exec, logs): the kubelet authenticates it
        // by the CA and asks the apiserver (SubjectAccessReview) what it may do.
        let kubelet_client = pki.issue_client("kube-apiserver-kubelet-client", "system:masters")?;
        std::fs::write(path("kubelet-client.crt"), &kubelet_client.cert_pem)?;
        std::fs::write(path("kubelet-client.key"), &kubelet_client.key_pem)?;
        let (sa_private, sa_public) = pki::signing_key_pem()?;
        std::fs::write(path("sa.key"), sa_private)?;
        std::fs::write(path("sa.pub"), sa_public)?;
        std::fs::write(
            path("tokens.csv"),
            format!(
                "{ADMIN_TOKEN},admin,admin-uid,\"system:masters\"\n\
                 {NODE_TOKEN},system:node:{NODE_NAME},node-uid,\"system:nodes\"\n\
                 {KUBE_PROXY_TOKEN},system:kube-proxy,kube-proxy-uid\n\
                 {VIRTUAL_NODE_TOKEN},virtual-kubelet,virtual-kubelet-uid\n"
            ),
        )?;
        std::fs::write(path("audit-policy.yaml"), audit::POLICY)?;

        let (client_port, peer_port, secure_port) = (free_port()?, free_port()?, free_port()?);
        let etcd_client = format!("http://127.0.0.1:{client_port}");
        let etcd_peer = format!("http://127.0.0.1:{peer_port}");
        let p = |name: &str| path(name).display().to_string();
        let etcd_args = vec![
            "--name=default".to_owned(),
            format!("--data-dir={}", p("etcd")),
            format!("--listen-client-urls={etcd_client}"),
            format!("--advertise-client-urls={etcd_client}"),
            format!("--listen-peer-urls={etcd_peer}"),
            format!("--initial-advertise-peer-urls={etcd_peer}"),
            format!("--initial-cluster=default={etcd_peer}"),
            // A test cluster's data is thrown away: fsync buys nothing and costs seconds.
            "--unsafe-no-fsync=true".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        let etcd = Daemon::spawn("etcd", &etcd_bin, &etcd_args, path("etcd.log"))?;
        let mut apiserver_args = vec![
            format!("--etcd-servers={etcd_client}"),
            format!("--bind-address={address}"),
            format!("--advertise-address={address}"),
            format!("--secure-port={secure_port}"),
            format!("--client-ca-file={}", p("ca.crt")),
            format!("--kubelet-client-certificate={}", p("kubelet-client.crt")),
            format!("--kubelet-client-key={}", p("kubelet-client.key")),
            // A test node's name resolves nowhere; its InternalIP is on the node network.
            "--kubelet-preferred-address-types=InternalIP".to_owned(),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--token-auth-file={}", p("tokens.csv")),
            // Node: what a kubelet may read and write, as in every real cluster.
            "--authorization-mode=Node,RBAC".to_owned(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            format!("--service-cluster-ip-range={}", services.cidr()),
            // Added to the default set, which already holds them today; named so a change of
            // defaults cannot silently drop what the tests are about.
            "--enable-admission-plugins=ServiceAccount,NodeRestriction,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy".to_owned(),
            format!("--audit-policy-file={}", p("audit-policy.yaml")),
            format!("--audit-log-path={}", p("audit.log")),
            // On loopback nothing could reach the `kubernetes` Service's endpoints; on a node
            // network kube-proxy routes the Service to the advertised address.
            format!(
                "--endpoint-reconciler-type={}",
                if address.is_loopback() { "none" } else { "lease" }
            ),
            // kube-apiserver's default: /debug/pprof (admins only) is where the benchmarks read
            // its live heap after a forced collection (ControlPlane::live_heap_bytes).
            "--profiling=true".to_owned(),
            "--v=1".to_owned(),
        ];
        apiserver_args.extend(flags.iter().map(|f| (*f).to_owned()));
        let apiserver = Daemon::spawn(
            "kube-apiserver",
            &apiserver_bin,
            &apiserver_args,
            path("apiserver.log"),
        )?;
        let mut cp = ControlPlane {
            kruise_manager: None,
            controller_manager: None,
            controllers: Default::default(),
            scheduler: None,
            apiserver,
            etcd,
            url: format!("https://{address}:{secure_port}"),
            etcd_url: etcd_client,
            services,
            pki,
            dir,
        };
        cp.write_kubeconfig_for_token(cp.dir.path().join("admin.kubeconfig"), ADMIN_TOKEN)?;
        cp.wait_ready().await?;
        Ok(cp)
    }
}
