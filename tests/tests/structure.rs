//! The shape of the source tree: no import cycle between the modules of any crate (a
//! module's child files count as the module), and no source file past 600 lines outside
//! tests, so each file keeps to one job.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every crate's `src` folder.
fn crate_sources() -> Vec<PathBuf> {
    let mut out = vec![root().join("kernels/src"), root().join("bench/src")];
    for e in std::fs::read_dir(root().join("crates")).unwrap() {
        let src = e.unwrap().path().join("src");
        if src.is_dir() {
            out.push(src);
        }
    }
    out.sort();
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without comments and without its unit-test module.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Top-level modules a text names through `crate::…`, including `use crate::{a, b::c}`.
fn crate_refs(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(list) = rest.strip_prefix('{') {
            let list = &list[..list.find('}').unwrap_or(list.len())];
            out.extend(list.split(',').map(|p| ident(p.trim())));
        } else {
            out.insert(ident(rest));
        }
    }
    out.retain(|m| !m.is_empty());
    out
}

/// Module graph of a crate: top-level module → the top-level modules it uses.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let top = first.trim_end_matches(".rs").to_string();
        if top == "lib" || top == "main" || top == "bin" {
            continue;
        }
        let refs = crate_refs(&code(&f));
        g.entry(top.clone())
            .or_default()
            .extend(refs.into_iter().filter(|r| *r != top));
    }
    g
}

/// One cycle of `g`, if any.
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        u: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(u.to_string(), 1);
        stack.push(u.to_string());
        for v in g.get(u).into_iter().flatten() {
            if !g.contains_key(v) {
                continue;
            }
            match state.get(v) {
                Some(1) => {
                    let at = stack.iter().position(|s| s == v).unwrap();
                    let mut c = stack[at..].to_vec();
                    c.push(v.clone());
                    return Some(c);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(v, g, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(u.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for u in g.keys() {
        if !state.contains_key(u) {
            if let Some(c) = visit(u, g, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let g = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    assert_eq!(
        find_cycle(&g(&[("a", "b"), ("b", "c"), ("c", "a")])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(find_cycle(&g(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
    let refs =
        crate_refs("use crate::{job::Job, outcome, Error};\nlet x = crate::verify::Verify::Exact;");
    assert_eq!(
        refs.into_iter().collect::<Vec<_>>(),
        ["job", "outcome", "verify"]
    );
}

#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    for src in crate_sources() {
        let g = module_graph(&src);
        assert_eq!(find_cycle(&g), None, "{}", src.display());
    }
}

#[test]
fn no_source_file_is_longer_than_600_lines() {
    for src in crate_sources() {
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for f in files {
            let n = std::fs::read_to_string(&f).unwrap().lines().count();
            assert!(n <= 600, "{} has {n} lines", f.display());
        }
    }
    let main = std::fs::read_to_string(root().join("crates/cli/src/main.rs")).unwrap();
    assert!(
        main.lines().count() < 150,
        "the CLI's main.rs holds only the command tree"
    );
}
