//! Embeds every manifest under the workspace's `models/` folder into the binary.
use std::io::Write;

fn main() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    entries.retain(|p: &std::path::PathBuf| p.extension().is_some_and(|e| e == "toml"));
    entries.sort();
    let out = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("manifests.rs");
    let mut f = std::fs::File::create(out).unwrap();
    writeln!(f, "pub(crate) const BUILTIN: &[(&str, &str)] = &[").unwrap();
    for p in entries {
        println!("cargo:rerun-if-changed={}", p.display());
        let canon = p.canonicalize().unwrap();
        writeln!(
            f,
            "    ({:?}, include_str!({:?})),",
            p.file_name().unwrap().to_string_lossy(),
            canon.display().to_string()
        )
        .unwrap();
    }
    writeln!(f, "];").unwrap();
}
