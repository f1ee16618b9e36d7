//! Credentials and endpoint of a shared store, read the way the AWS SDKs read them: environment
//! first (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` /
//! `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL`), then the profile
//! (`AWS_PROFILE`, else `default`) of the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`,
//! else `~/.aws/credentials`) and of the config file (`AWS_CONFIG_FILE`, else `~/.aws/config`).
//!
//! `object_store`'s `AmazonS3Builder::from_env` reads the environment only (and spells the
//! endpoint `AWS_ENDPOINT`); the profile files are a small INI format, parsed here rather than
//! pulling in the AWS SDK's config crate and its dependency tree.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Where each setting came from, for the logs and errors ("access key <- AWS_ACCESS_KEY_ID").
#[derive(Clone, Debug, Default)]
pub struct Resolved {
    /// Access key id.
    pub access_key_id: Option<String>,
    /// Secret access key.
    pub secret_access_key: Option<String>,
    /// Session token.
    pub session_token: Option<String>,
    /// Region.
    pub region: Option<String>,
    /// Endpoint URL (S3-compatible servers).
    pub endpoint: Option<String>,
    /// The source of each setting that was found, by setting name.
    pub sources: BTreeMap<&'static str, String>,
}

impl Resolved {
    /// One line naming each setting's source, secrets left out.
    pub fn describe(&self) -> String {
        self.sources
            .iter()
            .map(|(k, v)| format!("{k} <- {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Parses an INI file into `section -> key -> value` (comments `#`/`;`, keys lower-cased).
fn parse_ini(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_string();
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            out.entry(section.clone())
                .or_default()
                .insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    out
}

fn home_file(env: &dyn Fn(&str) -> Option<String>, var: &str, rel: &str) -> Option<PathBuf> {
    if let Some(p) = env(var) {
        return Some(PathBuf::from(p));
    }
    env("HOME").map(|h| PathBuf::from(h).join(rel))
}

/// Sets `slot` from `value` unless an earlier source set it, recording where it came from.
fn fill(
    slot: &mut Option<String>,
    sources: &mut BTreeMap<&'static str, String>,
    what: &'static str,
    value: &str,
    from: String,
) {
    if slot.is_none() {
        *slot = Some(value.to_string());
        sources.insert(what, from);
    }
}

/// Resolves credentials, region and endpoint from the environment and the profile files.
pub fn resolve() -> Resolved {
    resolve_with(&|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
}

/// [`resolve`] over the variables `env` returns (tests pass their own).
pub fn resolve_with(env: &dyn Fn(&str) -> Option<String>) -> Resolved {
    let mut r = Resolved::default();
    let Resolved {
        access_key_id,
        secret_access_key,
        session_token,
        region,
        endpoint,
        sources,
    } = &mut r;
    for var in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL_S3",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT",
    ] {
        let Some(v) = env(var) else { continue };
        let (slot, what) = match var {
            "AWS_ACCESS_KEY_ID" => (&mut *access_key_id, "access key"),
            "AWS_SECRET_ACCESS_KEY" => (&mut *secret_access_key, "secret key"),
            "AWS_SESSION_TOKEN" => (&mut *session_token, "session token"),
            "AWS_REGION" | "AWS_DEFAULT_REGION" => (&mut *region, "region"),
            _ => (&mut *endpoint, "endpoint"),
        };
        fill(slot, sources, what, &v, var.to_string());
    }
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    if let Some(path) = home_file(env, "AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials")
        && let Ok(text) = fs_err::read_to_string(&path)
        && let Some(sec) = parse_ini(&text).get(&profile)
    {
        for (k, what) in [
            ("aws_access_key_id", "access key"),
            ("aws_secret_access_key", "secret key"),
            ("aws_session_token", "session token"),
        ] {
            let Some(v) = sec.get(k) else { continue };
            let slot = match k {
                "aws_access_key_id" => &mut *access_key_id,
                "aws_secret_access_key" => &mut *secret_access_key,
                _ => &mut *session_token,
            };
            let from = format!("{} [{profile}] {k}", path.display());
            fill(slot, sources, what, v, from);
        }
    }
    if let Some(path) = home_file(env, "AWS_CONFIG_FILE", ".aws/config")
        && let Ok(text) = fs_err::read_to_string(&path)
    {
        let name = if profile == "default" {
            "default".to_string()
        } else {
            format!("profile {profile}")
        };
        if let Some(sec) = parse_ini(&text).get(&name) {
            if let Some(v) = sec.get("region") {
                let from = format!("{} [{name}] region", path.display());
                fill(region, sources, "region", v, from);
            }
            if let Some(v) = sec.get("endpoint_url") {
                let from = format!("{} [{name}] endpoint_url", path.display());
                fill(endpoint, sources, "endpoint", v, from);
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ini_sections_and_comments() {
        let ini = parse_ini(
            "# c\n[default]\naws_access_key_id = AK\n; c\n[profile team]\nRegion=eu-west-1\n",
        );
        assert_eq!(ini["default"]["aws_access_key_id"], "AK");
        assert_eq!(ini["profile team"]["region"], "eu-west-1");
    }

    #[test]
    fn environment_first_then_the_profile_files() {
        let dir = tempfile::tempdir().expect("tmp");
        let creds = dir.path().join("credentials");
        let config = dir.path().join("config");
        fs_err::write(
            &creds,
            "[default]\naws_access_key_id = FILE-DEFAULT\n[team]\naws_access_key_id = FILE-TEAM\naws_secret_access_key = S-TEAM\n",
        )
        .expect("write");
        fs_err::write(
            &config,
            "[profile team]\nregion = eu-north-1\nendpoint_url = http://127.0.0.1:9000\n",
        )
        .expect("write");
        let (c, f) = (creds.display().to_string(), config.display().to_string());
        let env = move |name: &str| match name {
            "AWS_PROFILE" => Some("team".to_string()),
            "AWS_SHARED_CREDENTIALS_FILE" => Some(c.clone()),
            "AWS_CONFIG_FILE" => Some(f.clone()),
            "AWS_ACCESS_KEY_ID" => Some("ENV".to_string()),
            _ => None,
        };
        let r = resolve_with(&env);
        assert_eq!(r.access_key_id.as_deref(), Some("ENV"));
        assert_eq!(r.sources["access key"], "AWS_ACCESS_KEY_ID");
        assert_eq!(r.secret_access_key.as_deref(), Some("S-TEAM"));
        assert!(r.sources["secret key"].ends_with("[team] aws_secret_access_key"));
        assert_eq!(r.region.as_deref(), Some("eu-north-1"));
        assert_eq!(r.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert!(!r.describe().contains("S-TEAM"), "secrets never described");
    }
}
