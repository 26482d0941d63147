//! testkit's `pods/exec` endpoint for `api` exec mode tests and benchmarks: a pod `game-0`
//! (containers `game`, `podprobe`) in `default`, and commands spawned through podprobe's reaper
//! (which owns every child of a process that runs exec probes in-process).
#![allow(dead_code)]

use std::sync::Arc;

use futures::FutureExt;
use k8s_openapi::api::core::v1::Pod;
use nix::sys::wait::WaitStatus;
use podprobe::probe::reaper;
use testkit::{ApiServer, ExecRunner, SpawnRunner};

pub const NS: &str = "default";
pub const POD: &str = "game-0";

/// A runner spawning through [`reaper::spawn`] and waiting on its exit status future.
pub fn reaper_runner() -> Arc<dyn ExecRunner> {
    Arc::new(SpawnRunner::new(|command: &mut std::process::Command| {
        let (child, exit) = reaper::spawn(command)?;
        let code = async move {
            exit.wait().await.map(|status| match status {
                WaitStatus::Exited(_, code) => code,
                WaitStatus::Signaled(_, signal, _) => 128 + signal as i32,
                _ => -1,
            })
        };
        Ok((child, code.boxed()))
    }))
}

/// testkit with the reaper runner and pod `game-0`.
pub async fn start() -> ApiServer {
    let api = ApiServer::start().await.expect("start testkit");
    api.set_exec_runner(reaper_runner());
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": POD, "namespace": NS},
        "spec": {"containers": [
            {"name": "game", "image": "game:1"},
            {"name": "podprobe", "image": "podprobe:dev"}
        ]}
    }))
    .unwrap();
    api.create(&pod).expect("create pod");
    api
}
