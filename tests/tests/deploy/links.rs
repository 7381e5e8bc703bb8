//! No dead links (issue 41, gap 10: values.yaml pointed at a docs/configuration.md that did not
//! exist): every relative Markdown link of the docs, the READMEs and CHANGELOG.md names a file
//! that exists and, with `#anchor`, a heading of it; every `docs/<name>.md` the chart's values,
//! templates and NOTES name exists.

use std::path::{Path, PathBuf};

use super::alerts::anchor;
use super::manifests::repo_root;

fn markdown_files() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files = vec![
        root.join("README.md"),
        root.join("CHANGELOG.md"),
        root.join("charts/ipkeep/README.md"),
        root.join("deploy/README.md"),
    ];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

fn headings(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.push(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of `](target)` links in `text`, outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
    }
    out
}

#[test]
fn relative_links_and_anchors_resolve() {
    let mut dead = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).expect("read");
        let dir = file.parent().expect("a directory");
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") || link.contains(' ') {
                continue;
            }
            let (path, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                file.clone()
            } else {
                dir.join(path)
            };
            let shown = file.strip_prefix(repo_root()).unwrap_or(&file).display();
            if !target.exists() {
                dead.push(format!("{shown}: {link} (no such file)"));
            } else if !fragment.is_empty()
                && target.extension().is_some_and(|e| e == "md")
                && !headings(&target).iter().any(|h| h == fragment)
            {
                dead.push(format!("{shown}: {link} (no such heading)"));
            }
        }
    }
    assert!(dead.is_empty(), "dead links:\n{}", dead.join("\n"));
}

#[test]
fn the_docs_the_chart_names_exist() {
    let chart = repo_root().join("charts/ipkeep");
    let mut files = vec![chart.join("values.yaml"), chart.join("templates/NOTES.txt")];
    let mut stack = vec![chart.join("templates")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read") {
            let p = e.expect("an entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "yaml" || e == "tpl") {
                files.push(p);
            }
        }
    }
    let mut missing = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        for (at, _) in text.match_indices("docs/") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || matches!(c, '/' | '-' | '_' | '.'))
                .collect();
            let name = name.trim_end_matches('.');
            if name.ends_with(".md") && !repo_root().join(name).exists() {
                missing.push(format!("{}: {name}", file.display()));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}
