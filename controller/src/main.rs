//! `warmpath-controller` command line: `run` (the controller), `render -f FILE...` (print offline
//! what would be created), `crdgen` (write the CRDs into the Helm chart), `feed` (a standalone
//! endpoint/load feed server).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "warmpath-controller", version, about = "warmpath Kubernetes controller")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the controller against the cluster of the current kubeconfig / service account.
    Run,
    /// Print every object the controller would create for the given manifests (YAML, offline).
    Render {
        /// Manifest files (multi-document YAML): policies, HTTPRoutes, Gateways, Services, ...
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<PathBuf>,
    },
    /// Write the CRDs generated from the Rust types (one file per CRD) into DIR.
    Crdgen {
        /// Output directory; `-` prints all CRDs to stdout.
        #[arg(long, default_value = "charts/warmpath/crds")]
        out: String,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Crdgen { out } => crdgen(&out),
        Cmd::Run | Cmd::Render { .. } => anyhow::bail!("not implemented yet"),
    }
}

fn crdgen(out: &str) -> anyhow::Result<()> {
    for crd in warmpath_controller::crd::all() {
        let yaml = warmpath_controller::crd::to_yaml(&crd)?;
        if out == "-" {
            print!("---\n{yaml}");
        } else {
            let name = crd.metadata.name.clone().unwrap_or_default();
            std::fs::create_dir_all(out)?;
            std::fs::write(PathBuf::from(out).join(format!("{name}.yaml")), yaml)?;
        }
    }
    Ok(())
}
