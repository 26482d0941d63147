//! A node's own network namespace, joined to the host by a veth pair: the kubelet, containerd,
//! kube-proxy and the pods' bridge live in it, so each test's node has its own iptables, ports
//! (10250, 10256, ...) and pod subnet. The host gets one route, through the veth pair (gone
//! with it): the Services' addresses lead to the node, where kube-proxy forwards them, so the
//! apiserver reaches a webhook Service backed by pods as in a cluster.
//!
//! Host side `10.213.<n>.1/30`, node side `10.213.<n>.2/30` (the node's InternalIP); the first
//! free `<n>` is taken by creating its veth pair, which fails when another test holds it. The
//! node's control plane (started on the host side's address) gets Service addresses of its own,
//! `10.96.<n>.0/24` ([`ServiceRange`]), which the host routes to this node alone: two node tests
//! can run side by side without one's apiserver reaching the other's webhooks.
//!
//! The node's pods get the `<n>`-th /22 of `10.244.0.0/14` ([`NodeNetwork::pod_subnet`]),
//! which the host routes to the node too: two nodes of one control plane (a kubelet node beside a virtual node, each
//! in its network) reach each other's pods through the host, and reach the apiserver on the
//! first network's host side, an address of the host's own.

use std::net::Ipv4Addr;
use std::process::Command;

use super::super::Error;

/// The Services' virtual addresses of a control plane (`--service-cluster-ip-range`). One on a
/// node network's host side (`10.213.<n>.1`) gets `10.96.<n>.0/24`, which that network routes
/// to its node; any other (loopback: no node reaches it) `10.96.0.0/16`, routed nowhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceRange {
    base: Ipv4Addr,
    prefix: u8,
}

impl ServiceRange {
    /// The range of the control plane whose apiserver listens on `address`.
    pub fn of_apiserver(address: Ipv4Addr) -> ServiceRange {
        match address.octets() {
            [10, 213, index, 1] => ServiceRange {
                base: Ipv4Addr::new(10, 96, index, 0),
                prefix: 24,
            },
            _ => ServiceRange {
                base: Ipv4Addr::new(10, 96, 0, 0),
                prefix: 16,
            },
        }
    }

    /// `10.96.<n>.0/24`, as kube-apiserver's flag and `ip route` take it.
    pub fn cidr(&self) -> String {
        format!("{}/{}", self.base, self.prefix)
    }

    /// The `kubernetes` Service's ClusterIP: the apiserver gives it the range's first address,
    /// and in-pod clients (`KUBERNETES_SERVICE_HOST`) check the certificate against it.
    pub fn kubernetes_ip(&self) -> Ipv4Addr {
        let [a, b, c, d] = self.base.octets();
        Ipv4Addr::new(a, b, c, d + 1)
    }
}

#[derive(Debug)]
pub struct NodeNetwork {
    index: u8,
    netns: String,
}

impl NodeNetwork {
    /// Creates the namespace and the veth pair, with the node side up, addressed and routed.
    pub fn create() -> Result<NodeNetwork, Error> {
        // Start at a pid-dependent index so parallel test processes rarely race for one.
        let start = (std::process::id() % 200) as u8;
        for step in 0..200u8 {
            // In u16: start and step are each up to 199.
            let index = 1 + ((u16::from(start) + u16::from(step)) % 200) as u8;
            // The network is made (and so dropped, which deletes) only once its pair is ours:
            // a candidate whose index another network holds must not delete that network.
            let claimed = Command::new("ip")
                .args([
                    "link",
                    "add",
                    &host_link(index),
                    "type",
                    "veth",
                    "peer",
                    "name",
                ])
                .arg(node_link(index))
                .output()?;
            if claimed.status.success() {
                let network = NodeNetwork {
                    index,
                    netns: format!("podprobe-node-{index}"),
                };
                network.set_up()?;
                return Ok(network);
            }
            let stderr = String::from_utf8_lossy(&claimed.stderr);
            if !stderr.contains("File exists") {
                return Err(Error::Other(format!(
                    "ip link add (a veth pair for the node's network namespace): {}",
                    stderr.trim()
                )));
            }
        }
        Err(Error::Other(
            "no free node network index (200 node networks exist)".into(),
        ))
    }

    fn host_link(&self) -> String {
        host_link(self.index)
    }

    fn node_link(&self) -> String {
        node_link(self.index)
    }

    /// The host side's address: where the apiserver listens for the node.
    pub fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.index, 1)
    }

    /// The node's InternalIP.
    pub fn node_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.index, 2)
    }

    /// The subnet the node's CNI bridge gives its pods: the `<n>`-th /22 of
    /// [`super::CLUSTER_POD_CIDR`], 1 021 pod addresses (a virtual node holds far more pods than a
    /// kubelet's 110).
    pub fn pod_subnet(&self) -> String {
        pod_subnet(self.index)
    }

    /// Whether `ip` is an address of [`Self::pod_subnet`].
    pub fn holds_pod_ip(&self, ip: &str) -> bool {
        holds_pod_ip(self.index, ip)
    }

    /// The namespace's name under `/run/netns`.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    fn set_up(&self) -> Result<(), Error> {
        let (host, node, netns) = (self.host_link(), self.node_link(), self.netns.clone());
        let host_cidr = format!("{}/30", self.host_ip());
        let node_cidr = format!("{}/30", self.node_ip());
        let host_ip = self.host_ip().to_string();
        let node_ip = self.node_ip().to_string();
        let service_cidr = ServiceRange::of_apiserver(self.host_ip()).cidr();
        let pod_subnet = self.pod_subnet();
        // Holding the veth pair makes the index ours; a namespace of that name can only be
        // left over from a test process that was killed before it cleaned up.
        let _ = Command::new("ip").args(["netns", "del", &netns]).output();
        let steps: Vec<Vec<&str>> = vec![
            vec!["ip", "netns", "add", &netns],
            vec!["ip", "link", "set", &node, "netns", &netns],
            vec!["ip", "addr", "add", &host_cidr, "dev", &host],
            vec!["ip", "link", "set", &host, "up"],
            vec!["ip", "-n", &netns, "link", "set", "lo", "up"],
            vec!["ip", "-n", &netns, "link", "set", &node, "name", "eth0"],
            vec!["ip", "-n", &netns, "addr", "add", &node_cidr, "dev", "eth0"],
            vec!["ip", "-n", &netns, "link", "set", "eth0", "up"],
            vec![
                "ip", "-n", &netns, "route", "add", "default", "via", &host_ip,
            ],
            // `replace`: a route left by a killed test's node would block `add`.
            vec![
                "ip",
                "route",
                "replace",
                &service_cidr,
                "via",
                &node_ip,
                "dev",
                &host,
            ],
            vec![
                "ip",
                "route",
                "replace",
                &pod_subnet,
                "via",
                &node_ip,
                "dev",
                &host,
            ],
            // Pods reach the apiserver through the node: it routes their packets.
            vec![
                "ip",
                "netns",
                "exec",
                &netns,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ],
        ];
        for step in steps {
            run(&step)?;
        }
        Ok(())
    }

    /// `command` run in the node's network namespace (e.g. `iptables-save`), its stdout.
    pub fn exec(&self, command: &[&str]) -> Result<String, Error> {
        let net = format!("--net=/run/netns/{}", self.netns);
        let mut full = vec!["nsenter", net.as_str(), "--"];
        full.extend(command);
        run(&full)
    }
}

fn host_link(index: u8) -> String {
    format!("pp{index}h")
}

fn node_link(index: u8) -> String {
    format!("pp{index}n")
}

fn run(command: &[&str]) -> Result<String, Error> {
    let out = Command::new(command[0]).args(&command[1..]).output()?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Other(format!(
            "`{}` failed: {}",
            command.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

fn first_pod_address(index: u8) -> u32 {
    u32::from(Ipv4Addr::new(10, 244, 0, 0)) + u32::from(index) * 1024
}

fn pod_subnet(index: u8) -> String {
    format!("{}/22", Ipv4Addr::from(first_pod_address(index)))
}

fn holds_pod_ip(index: u8, ip: &str) -> bool {
    ip.parse::<Ipv4Addr>()
        .is_ok_and(|ip| u32::from(ip) >> 10 == first_pod_address(index) >> 10)
}

impl Drop for NodeNetwork {
    fn drop(&mut self) {
        // Deleting the namespace deletes its end of the veth pair, and with it the host end.
        // The host end is deleted by name only when that failed: once the namespace is gone the
        // index is free, and another test's new pair may already bear that name.
        let deleted = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status()
            .is_ok_and(|s| s.success());
        if !deleted {
            let _ = Command::new("ip")
                .args(["link", "del", &self.host_link()])
                .output();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_network_has_a_22_of_the_cluster_pod_range() {
        assert_eq!(pod_subnet(1), "10.244.4.0/22");
        assert_eq!(pod_subnet(64), "10.245.0.0/22");
        assert_eq!(pod_subnet(200), "10.247.32.0/22");
        assert!(holds_pod_ip(1, "10.244.7.254"));
        assert!(!holds_pod_ip(1, "10.244.8.1"));
        assert!(!holds_pod_ip(2, "10.244.7.254"));
    }

    #[test]
    fn each_node_network_has_service_addresses_of_its_own() {
        let first = ServiceRange::of_apiserver(Ipv4Addr::new(10, 213, 7, 1));
        let second = ServiceRange::of_apiserver(Ipv4Addr::new(10, 213, 8, 1));
        assert_eq!(first.cidr(), "10.96.7.0/24");
        assert_eq!(first.kubernetes_ip(), Ipv4Addr::new(10, 96, 7, 1));
        assert_eq!(second.cidr(), "10.96.8.0/24");
        let loopback = ServiceRange::of_apiserver(Ipv4Addr::LOCALHOST);
        assert_eq!(loopback.cidr(), "10.96.0.0/16");
        assert_eq!(loopback.kubernetes_ip(), Ipv4Addr::new(10, 96, 0, 1));
    }
}
