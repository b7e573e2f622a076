//! Redaction of secrets in URIs and configs, for everything that leaves the process: logs,
//! config dumps, error messages and metrics never show a password, secret key or token.

/// What a secret is replaced with.
pub const REDACTED: &str = "***";

/// Query parameters whose values are secrets (matched case-insensitively, by substring):
/// `key` covers credentials such as `access_key_id` / `secret_access_key` given in a URI.
const SECRET_PARAMS: &[&str] = &[
    "password",
    "secret",
    "token",
    "credential",
    "signature",
    "key",
];

/// The URI with its password (`scheme://user:PASSWORD@host`) and the values of secret query
/// parameters (`password=…`, `…token=…`, …) replaced by `***`. Anything else — and strings
/// that are not URIs — is returned unchanged.
pub fn redact_uri(uri: &str) -> String {
    let Some(scheme_end) = uri.find("://") else {
        return uri.to_string();
    };
    let authority_start = scheme_end + 3;
    let rest = &uri[authority_start..];
    let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_len];
    let mut out = String::with_capacity(uri.len());
    out.push_str(&uri[..authority_start]);
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            match userinfo.find(':') {
                Some(colon) => {
                    out.push_str(&userinfo[..colon]);
                    out.push(':');
                    out.push_str(REDACTED);
                }
                None => out.push_str(userinfo),
            }
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    let tail = &rest[authority_len..];
    match tail.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            let (query, fragment) = match query.split_once('#') {
                Some((query, fragment)) => (query, Some(fragment)),
                None => (query, None),
            };
            let params: Vec<String> = query
                .split('&')
                .map(|param| match param.split_once('=') {
                    Some((key, _)) if is_secret_key(key) => format!("{key}={REDACTED}"),
                    _ => param.to_string(),
                })
                .collect();
            out.push_str(&params.join("&"));
            if let Some(fragment) = fragment {
                out.push('#');
                out.push_str(fragment);
            }
        }
        None => out.push_str(tail),
    }
    out
}

fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SECRET_PARAMS.iter().any(|secret| key.contains(secret))
}

/// The secrets found in `uri` (its password and secret query values), to scrub them from
/// messages produced by libraries that may quote the URI.
pub fn uri_secrets(uri: &str) -> Vec<String> {
    let redacted = redact_uri(uri);
    if redacted == uri {
        return Vec::new();
    }
    let mut secrets = Vec::new();
    if let Some(scheme_end) = uri.find("://") {
        let rest = &uri[scheme_end + 3..];
        let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
        if let Some(at) = authority.rfind('@') {
            if let Some((_, password)) = authority[..at].split_once(':') {
                secrets.push(password.to_string());
            }
        }
        if let Some((_, query)) = rest.split_once('?') {
            for param in query.split(['&', '#']) {
                if let Some((key, value)) = param.split_once('=') {
                    if is_secret_key(key) {
                        secrets.push(value.to_string());
                    }
                }
            }
        }
    }
    secrets.retain(|secret| !secret.is_empty());
    secrets
}

/// `message` with every occurrence of `uri` and of its secrets replaced by their redacted
/// forms.
pub fn scrub(message: &str, uri: &str) -> String {
    let mut message = message.replace(uri, &redact_uri(uri));
    for secret in uri_secrets(uri) {
        message = message.replace(&secret, REDACTED);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_and_secret_parameters_are_redacted() {
        for (uri, expected) in [
            (
                "postgres://shale:s3cr3t@db:5432/shale",
                "postgres://shale:***@db:5432/shale",
            ),
            (
                "postgresql://shale:p%40ss@db/shale?sslmode=require&password=also",
                "postgresql://shale:***@db/shale?sslmode=require&password=***",
            ),
            ("postgres://shale@db/shale", "postgres://shale@db/shale"),
            (
                "postgres://db/shale?user=a&PassWord=x#frag",
                "postgres://db/shale?user=a&PassWord=***#frag",
            ),
            ("s3://bucket/prefix", "s3://bucket/prefix"),
            (
                "s3://bucket/prefix?region=eu-west-1&access_key_id=AKIDX&secret_access_key=SKX",
                "s3://bucket/prefix?region=eu-west-1&access_key_id=***&secret_access_key=***",
            ),
            (
                "s3://user:SKX@bucket/prefix?X-Amz-Credential=AKIDX&apikey=K",
                "s3://user:***@bucket/prefix?X-Amz-Credential=***&apikey=***",
            ),
            (
                "https://h/p?X-Amz-Security-Token=abc&a=1",
                "https://h/p?X-Amz-Security-Token=***&a=1",
            ),
            (
                "sqlite:///var/lib/shale/metastore.db",
                "sqlite:///var/lib/shale/metastore.db",
            ),
            ("/plain/path.db", "/plain/path.db"),
        ] {
            assert_eq!(redact_uri(uri), expected, "{uri}");
        }
        assert_eq!(
            uri_secrets("postgres://u:pw@h/d?password=two"),
            ["pw", "two"]
        );
        assert_eq!(
            scrub(
                "cannot connect to postgres://u:pw@h/d: auth failed for pw",
                "postgres://u:pw@h/d"
            ),
            "cannot connect to postgres://u:***@h/d: auth failed for ***"
        );
    }
}
