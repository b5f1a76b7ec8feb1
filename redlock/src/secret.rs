//! Printing configuration without its secrets: every URL the library shows anywhere (a
//! `Debug` or `Display`, an error, a log field) goes through [`redact_url`] first.

use std::fmt;

/// What a password is printed as.
pub(crate) const MASK: &str = "***";

/// `url` with its password replaced by `***`: `redis://user:***@host:6379/0`. A user info
/// without a colon (`redis://secret@host`, where the only name may well be a password) is
/// masked whole, and so are the values of `pass` and `password` query parameters (the
/// `redis+unix://` form). Anything that does not look like a URL is masked whole.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        // Not a URL: a `host:port` is shown (what a user most often forgets the scheme of),
        // with anything before an `@` masked; any other text may hold a secret.
        let (masked, host) = match url.rsplit_once('@') {
            Some((_, host)) => (true, host),
            None => (false, url),
        };
        let hostlike = |c: char| c.is_ascii_alphanumeric() || ".-_:[]".contains(c);
        return match (masked, !host.is_empty() && host.chars().all(hostlike)) {
            (true, true) => format!("{MASK}@{host}"),
            (false, true) => host.to_owned(),
            (_, false) => MASK.to_owned(),
        };
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(at) => before_query.split_at(at),
        None => (before_query, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((user_info, host)) => match user_info.split_once(':') {
            Some((user, _password)) => format!("{user}:{MASK}@{host}"),
            None => format!("{MASK}@{host}"),
        },
        None => authority.to_owned(),
    };
    let mut out = format!("{scheme}://{authority}{path}");
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((name, _)) if is_secret_param(name) => format!("{name}={MASK}"),
                _ => param.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

fn is_secret_param(name: &str) -> bool {
    ["pass", "password"].iter().any(|secret| name.eq_ignore_ascii_case(secret))
}

/// A list of node URLs that prints redacted.
pub(crate) struct RedactedUrls<'a>(pub(crate) &'a [String]);

impl fmt::Debug for RedactedUrls<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter().map(|url| redact_url(url))).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked_and_everything_else_is_kept() {
        let cases = [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://127.0.0.1:6379/2", "redis://127.0.0.1:6379/2"),
            ("redis://:s3cret@host:6379", "redis://:***@host:6379"),
            ("rediss://app:s3cret@host:6380/1", "rediss://app:***@host:6380/1"),
            ("redis://app:p%40ss:w@rd@host", "redis://app:***@host"),
            ("redis://s3cret@host", "redis://***@host"),
            (
                "redis+unix:///run/redis.sock?db=1&pass=s3cret",
                "redis+unix:///run/redis.sock?db=1&pass=***",
            ),
            ("redis+unix:///run/r.sock?PASSWORD=s3cret", "redis+unix:///run/r.sock?PASSWORD=***"),
            ("not a url with s3cret", "***"),
            ("127.0.0.1:7101", "127.0.0.1:7101"),
            ("app:s3cret@127.0.0.1:7101", "***@127.0.0.1:7101"),
        ];
        for (url, redacted) in cases {
            assert_eq!(redact_url(url), redacted, "{url}");
            assert!(!redact_url(url).contains("s3cret"));
        }
    }
}
