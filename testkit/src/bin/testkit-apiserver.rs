//! `testkit-apiserver --port N [--kubeconfig FILE]`: serve the testkit API
//! until interrupted. `GET /testkit/journal`, `POST /testkit/faults`.

use std::path::PathBuf;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(about = "testkit's in-process Kubernetes API server, standalone")]
struct Args {
    /// Port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Write a kubeconfig for the admin user here.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> Result<(), testkit::Error> {
    let args = Args::parse();
    let api = testkit::ApiServer::builder()
        .port(args.port)
        .start()
        .await?;
    if let Some(path) = &args.kubeconfig {
        api.write_kubeconfig(path)?;
    }
    println!("testkit-apiserver listening on {}", api.url());
    let _ = tokio::signal::ctrl_c().await;
    api.stop().await;
    Ok(())
}
