//! The validator's modules stand on floors, and every import runs down: a module uses only the
//! modules on floors below its own (docs/design/architecture.md, "The validator's floors"). At
//! the bottom are the verdict's own types and the configuration, which the subsystems fill in
//! and read; nothing there knows the store, the planner or the attestation that use them. An
//! import that ran back up would tie a lower layer to a higher one, and the next change would
//! make a circle of them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Each top-level module of `validator/src` and its floor, lowest first. A new module gets the
/// floor just above the highest it imports.
const FLOORS: &[(&str, u32)] = &[
    ("backoffs", 1),
    ("config", 1),
    ("in_flight", 1),
    ("untrusted", 1),
    ("verdict", 1),
    ("store", 2),
    ("verdict_wire", 2),
    ("device_identity", 3),
    ("metrics", 3),
    ("rates", 3),
    ("watch", 3),
    ("memory", 4),
    ("operator", 4),
    ("planner", 5),
    ("show", 5),
    ("transcript", 5),
    ("attest", 6),
    ("audit", 7),
    ("cli", 7),
    ("scheduler", 7),
    ("service", 7),
    ("server", 8),
    ("daemon", 9),
    ("commands", 10),
    ("lib", 11),
    ("main", 12),
];

fn validator_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../validator/src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("validator/src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top module a file under a crate's `src` belongs to (`store` for `store/rates.rs`), or
/// `None` for a module's tests in a file of their own, which are test code like an inline test
/// module.
fn top_module(relative: &Path) -> Option<String> {
    if relative.file_name().is_some_and(|n| n == "tests.rs") {
        return None;
    }
    let first = relative.components().next()?;
    Some(first.as_os_str().to_str()?.trim_end_matches(".rs").to_string())
}

/// The code of a file that ships: its inline test module (which may reach anywhere to build
/// what it tests) left out, and comments skipped.
fn shipped_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let end = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
    text[..end]
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
}

/// The modules `line` names as `crate::<module>`.
fn crate_modules(line: &str) -> Vec<&str> {
    named_after(line, "crate::")
}

/// What `line` names right after each `prefix`.
fn named_after<'a>(line: &'a str, prefix: &str) -> Vec<&'a str> {
    line.match_indices(prefix)
        .map(|(at, found)| {
            let rest = &line[at + found.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|module| !module.is_empty())
        .collect()
}

#[test]
fn every_import_in_the_validator_runs_down_its_floors() {
    let floors: BTreeMap<&str, u32> = FLOORS.iter().copied().collect();
    let src = validator_src();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    assert!(
        files.len() > 20,
        "found only {} files under {}",
        files.len(),
        src.display()
    );
    let mut wrong = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under validator/src");
        let Some(module) = top_module(relative) else {
            continue;
        };
        let module = module.as_str();
        let Some(&floor) = floors.get(module) else {
            wrong.push(format!(
                "{}: module `{module}` has no floor; add it to FLOORS (and the map) above what it imports",
                relative.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).expect("a readable source file");
        for (at, line) in shipped_lines(&text) {
            for used in crate_modules(line) {
                if used == module {
                    continue;
                }
                match floors.get(used) {
                    Some(&below) if below < floor => {}
                    Some(&other) => wrong.push(format!(
                        "{}:{}: `{module}` (floor {floor}) imports `{used}` (floor {other}): an import back up",
                        relative.display(),
                        at + 1
                    )),
                    None => wrong.push(format!(
                        "{}:{}: `crate::{used}` is not a module with a floor",
                        relative.display(),
                        at + 1
                    )),
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The rule is checked, not just stated: an import back up in a file like the validator's is
/// found, with its line.
#[test]
fn an_import_back_up_is_what_the_check_finds() {
    let text =
        "//! The store.\nuse crate::verdict::Verdict;\nuse crate::planner::plan;\n// crate::attest in a comment\n";
    let found: Vec<(usize, Vec<&str>)> = shipped_lines(text)
        .map(|(at, line)| (at, crate_modules(line)))
        .filter(|(_, modules)| !modules.is_empty())
        .collect();
    assert_eq!(found, vec![(1, vec!["verdict"]), (2, vec!["planner"])]);
    let floors: BTreeMap<&str, u32> = FLOORS.iter().copied().collect();
    assert!(
        floors["planner"] > floors["store"],
        "the planner stands above the store"
    );
}

/// Whether `super::` in the file at `relative` (under a crate's `src`) names the crate's root:
/// a top module's own file (`pool.rs`, `store/mod.rs`), whose `super::<module>` is
/// `crate::<module>`.
fn super_is_the_root(relative: &Path) -> bool {
    let parts: Vec<_> = relative.components().collect();
    parts.len() == 1 || (parts.len() == 2 && relative.file_name().is_some_and(|n| n == "mod.rs"))
}

/// The top modules of `crate_src` and the others each names in its shipped code, as
/// `crate::<module>`, or as `super::<module>` where that is the same.
fn module_imports(crate_src: &Path) -> BTreeMap<String, std::collections::BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(crate_src, &mut files);
    let mut imports: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let relative = file.strip_prefix(crate_src).expect("under the crate");
        let Some(module) = top_module(relative) else {
            continue;
        };
        let text = std::fs::read_to_string(file).expect("a readable source file");
        let from_root = super_is_the_root(relative);
        let used: Vec<String> = shipped_lines(&text)
            .flat_map(|(_, line)| {
                let mut named = crate_modules(line);
                if from_root {
                    named.extend(named_after(line, "super::"));
                }
                named
            })
            .filter(|used| *used != module)
            .map(str::to_string)
            .collect();
        imports.entry(module).or_default().extend(used);
    }
    imports
}

/// A circle of modules that import each other, if `imports` has one.
fn circle(imports: &BTreeMap<String, std::collections::BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        module: &str,
        imports: &BTreeMap<String, std::collections::BTreeSet<String>>,
        done: &mut std::collections::BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| m == module) {
            let mut found = path[at..].to_vec();
            found.push(module.to_string());
            return Some(found);
        }
        if !done.insert(module.to_string()) {
            return None;
        }
        path.push(module.to_string());
        let found = imports
            .get(module)
            .into_iter()
            .flatten()
            .filter(|next| imports.contains_key(*next))
            .find_map(|next| visit(next, imports, done, path));
        path.pop();
        found
    }
    let mut done = std::collections::BTreeSet::new();
    imports
        .keys()
        .find_map(|module| visit(module, imports, &mut done, &mut Vec::new()))
}

/// The other crates keep the same rule where it is cheapest to state: no two of their top
/// modules import each other, directly or round a circle.
#[test]
fn no_crate_has_a_circle_of_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for crate_src in ["miner/src", "kernels/src", "daemon/src", "validator/src", "shared/src"] {
        let imports = module_imports(&root.join(crate_src));
        assert!(imports.len() > 5, "{crate_src}: only {} modules found", imports.len());
        assert_eq!(circle(&imports), None, "{crate_src}: modules that import each other");
    }
    // And the check finds a circle where there is one, and sees `super::` from a top module's
    // file as the crate's root (kernels' modules import each other so), not from deeper down.
    assert!(super_is_the_root(Path::new("pool.rs")) && super_is_the_root(Path::new("store/mod.rs")));
    assert!(!super_is_the_root(Path::new("store/rates.rs")));
    let mut looped: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    looped.entry("a".into()).or_default().insert("b".into());
    looped.entry("b".into()).or_default().insert("c".into());
    looped.entry("c".into()).or_default().insert("a".into());
    assert_eq!(
        circle(&looped),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}
