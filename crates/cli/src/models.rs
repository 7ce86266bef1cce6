//! `speccompact models`: the model store (list, fetch, verify, path).

use crate::load::resolve;
use anyhow::{bail, Result};
use clap::Subcommand;
use speccompact_store::{Status, Store};

/// Flags of `models`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub cmd: ModelsCmd,
}

/// The store commands.
#[derive(Subcommand)]
pub enum ModelsCmd {
    /// List known models and whether they are cached.
    List,
    /// Download and verify a model (no-op when already verified).
    Fetch { name: String },
    /// Check a cached model's size and sha256.
    Verify { name: String },
    /// Print where a model lives in the cache.
    Path { name: String },
}

/// Runs `models`.
pub fn run(a: &Args, store: &Store) -> Result<()> {
    match &a.cmd {
        ModelsCmd::List => list(store)?,
        ModelsCmd::Fetch { name } => println!("{}", resolve(store, name)?.display()),
        ModelsCmd::Verify { name } => match store.verify(name)? {
            Status::Verified => println!("{name}: verified ({})", store.path(name)?.display()),
            Status::Missing => {
                bail!("{name}: not in the cache; run `speccompact models fetch {name}`")
            }
            Status::Corrupt { actual, size } => bail!(
                "{name}: cached file is corrupt (sha256 {actual}, {size} bytes); run `speccompact models fetch {name}` to replace it"
            ),
        },
        ModelsCmd::Path { name } => println!("{}", store.path(name)?.display()),
    }
    Ok(())
}

/// One line per known model with its cache status.
fn list(store: &Store) -> Result<()> {
    println!(
        "{:<32} {:<8} {:<8} {:>12}  status",
        "name", "arch", "role", "bytes"
    );
    for m in store.manifests() {
        let status = match store.verify(&m.name)? {
            Status::Missing if m.network => "not cached (needs hub access)",
            Status::Missing => "not fetched",
            Status::Verified => "verified",
            Status::Corrupt { .. } => "CORRUPT (run fetch)",
        };
        let size = if m.size > 0 {
            m.size.to_string()
        } else {
            "-".to_string()
        };
        println!(
            "{:<32} {:<8} {:<8} {:>12}  {status}",
            m.name, m.architecture, m.role, size
        );
    }
    Ok(())
}
