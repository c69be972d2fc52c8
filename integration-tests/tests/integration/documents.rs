//! Checks on the project's documents that keep them true to the tree: the developer's map
//! (docs/design/architecture.md) names only files that exist, and no document calls protocol
//! version 4 a preview of the CPU backend alone (a CUDA miner speaks it once its self-check has
//! passed the version 4 walk).

use std::path::{Path, PathBuf};

/// The repository's root: this crate's parent.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("integration-tests sits in the workspace")
        .to_path_buf()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every code span of `markdown` (text between single backticks) that looks like a path in the
/// tree: it contains a `/`, no spaces, and ends in a file extension or a `/`.
fn named_paths(markdown: &str) -> Vec<String> {
    markdown
        .split("```")
        .step_by(2) // outside fenced blocks
        .flat_map(|text| text.split('`').skip(1).step_by(2))
        .filter(|span| {
            let last = span.rsplit('/').next().unwrap_or("");
            span.contains('/')
                && !span.contains(char::is_whitespace)
                && !span.contains("::")
                && !span.starts_with('/')
                && !span.contains("://")
                && (span.ends_with('/') || last.contains('.'))
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn the_developers_map_names_only_files_that_exist() {
    let map = read("docs/design/architecture.md");
    let named = named_paths(&map);
    assert!(
        named.len() >= 30,
        "the map names {} files: a map of an attestation's route names far more",
        named.len()
    );
    let missing: Vec<&String> = named.iter().filter(|p| !root().join(p).exists()).collect();
    assert!(
        missing.is_empty(),
        "docs/design/architecture.md names files that do not exist (moved or renamed? update the map): {missing:?}"
    );
}

#[test]
fn the_map_is_linked_from_the_entrances() {
    assert!(read("README.md").contains("docs/design/architecture.md"));
    assert!(read("docs/README.md").contains("design/architecture.md"));
}

/// The finder itself: it takes paths and leaves other code spans alone.
#[test]
fn named_paths_are_the_code_spans_that_look_like_paths() {
    let text = "see `validator/src/planner.rs` and `proto/`, not `plan_v4::plan` or `a / b` \
                or `https://example.org/x.md`\n```\n`inside/a/fence.rs`\n```\n`shared/src/lib.rs`";
    assert_eq!(
        named_paths(text),
        ["validator/src/planner.rs", "proto/", "shared/src/lib.rs"]
    );
}

/// What a document must not say of version 4 now that a CUDA miner speaks it: the phrases the
/// old wording used. Records of past runs (docs/benchmarks/) and the superseded design note keep
/// their history.
#[test]
fn no_document_calls_version_4_a_cpu_only_preview() {
    let stale = [
        "cpu-only preview",
        "cpu only preview",
        "a cpu preview",
        "preview on the cpu backend only",
        "version 4 on the cpu backend only",
        "preview (cpu backend only",
        "preview, cpu backend only",
        "a gpu miner speaks 3",
        "gpu miners speak 3",
    ];
    let mut documents = Vec::new();
    collect_markdown(&root(), &mut documents);
    for must in ["README.md", "PROTOCOL.md", "SECURITY.md", "docs/guide.md"] {
        assert!(
            documents.contains(&root().join(must)),
            "{must} is not among {documents:?}"
        );
    }
    let mut found = Vec::new();
    for path in documents {
        let text = std::fs::read_to_string(&path).unwrap();
        // Phrases may break across lines.
        let flat = text.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase();
        for phrase in stale.iter().filter(|p| flat.contains(*p)) {
            found.push(format!("{}: {phrase:?}", path.strip_prefix(root()).unwrap().display()));
        }
    }
    assert!(found.is_empty(), "stale wording about version 4: {found:?}");
}

/// The project's Markdown, but for build output, the fuzz corpus, dated records and the
/// superseded design note.
fn collect_markdown(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            let skipped = ["target", ".git", "fuzz", "node_modules", "benchmarks"];
            if !skipped.contains(&name.as_str()) && !name.starts_with('.') {
                collect_markdown(&path, out);
            }
        } else if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("md")) && name != "protocol-v4.md" {
            out.push(path);
        }
    }
}
