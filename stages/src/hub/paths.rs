//! Validation of names that come from a server: repository ids and file paths. A file name may not
//! escape the snapshot folder: absolute paths, `..`, empty or `.` components and backslashes are
//! refused.

/// Checks a repository id `ORG/NAME`.
pub fn validate_repo_id(repo: &str) -> Result<(), String> {
    let ok_part = |p: &str| {
        !p.is_empty()
            && p != "."
            && p != ".."
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    match repo.split_once('/') {
        Some((org, name)) if ok_part(org) && ok_part(name) => Ok(()),
        _ => Err(format!("repository id {repo:?} is not ORG/NAME")),
    }
}

/// Checks a path inside a repository, as listed by the server.
pub fn validate_repo_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("empty file name".into());
    }
    if path.starts_with('/')
        || path.contains('\\')
        || path.contains('\0')
        || path.contains(':') && cfg!(windows)
    {
        return Err(format!(
            "file name {path:?} is absolute or has a backslash or NUL"
        ));
    }
    if path
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(format!(
            "file name {path:?} has an empty, '.' or '..' component"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_escapes() {
        for bad in [
            "../../evil",
            "/etc/passwd",
            "a/../b",
            "a//b",
            "./a",
            "a\\b",
            "",
        ] {
            assert!(validate_repo_path(bad).is_err(), "{bad}");
        }
        for good in ["model.q4nx", "sub/dir/file.json", ".gitattributes"] {
            assert!(validate_repo_path(good).is_ok(), "{good}");
        }
        assert!(validate_repo_id("FastFlowLM/Gemma3-270M-NPU2").is_ok());
        for bad in ["x", "a/b/c", "../b", "a/", "a b/c"] {
            assert!(validate_repo_id(bad).is_err(), "{bad}");
        }
    }
}
