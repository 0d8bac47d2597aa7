//! The `host_in` allowlist: compiled host entries and URL checks.
//!
//! URLs are parsed with the WHATWG parser of the `url` crate, so the host we
//! check is the host a conforming client connects to
//! (`https://uploads.example.com@evil.com` is `evil.com`). To narrow the room
//! for parser differentials with whatever the handler uses, inputs with
//! userinfo, whitespace, control characters or backslashes are refused
//! outright rather than normalised. So is every authority a parser could
//! read in more than one way: userinfo of any kind, even empty
//! (`https://@host/`), percent-encoded octets (`uploads%2Eexample.com`),
//! host characters NFKC would change (fullwidth dots) or invisible ones,
//! a trailing dot, an IPv4 address in any spelling but dotted decimal
//! (`0x0a.0.0.7`, `167772167`, `10.7`), and a URL without `//` before its
//! host (`https:uploads.example.com`).

use std::net::{IpAddr, Ipv6Addr};

use url::{Host, Url};

/// How a URL failed `host_in`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostProblem {
    /// The scheme is not allowed.
    Scheme,
    /// Anything else: not a URL, no host, userinfo, host or port not allowed.
    Host,
}

/// One compiled allowlist entry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostEntry {
    pattern: HostPattern,
    /// `None`: only the scheme's default port.
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// An exact domain, lowercase ASCII (IDNA-encoded).
    Exact(String),
    /// `*.example.com`, stored as `.example.com`: any strict subdomain.
    Subdomains(String),
    /// An IP literal.
    Ip(IpAddr),
}

/// A compiled `host_in` rule.
#[derive(Debug, Clone)]
pub(crate) struct HostAllow {
    schemes: Box<[String]>,
    hosts: Box<[HostEntry]>,
}

impl HostAllow {
    /// Compile the entries; the error names the bad entry and why.
    pub(crate) fn compile(
        hosts: &[String],
        schemes: &[String],
    ) -> Result<Self, (HostCompileError, String)> {
        let mut compiled_schemes = Vec::with_capacity(schemes.len());
        for scheme in schemes {
            let valid = scheme
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_lowercase())
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b));
            if !valid {
                return Err((HostCompileError::Scheme, scheme.clone()));
            }
            compiled_schemes.push(scheme.clone());
        }
        let mut entries = Vec::with_capacity(hosts.len());
        for host in hosts {
            let entry =
                parse_entry(host).map_err(|why| (HostCompileError::Host(why), host.clone()))?;
            entries.push(entry);
        }
        Ok(Self {
            schemes: compiled_schemes.into_boxed_slice(),
            hosts: entries.into_boxed_slice(),
        })
    }

    /// Check one URL.
    pub(crate) fn check(&self, raw: &str) -> Result<(), HostProblem> {
        if raw
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || c == '\\')
        {
            return Err(HostProblem::Host);
        }
        let url = Url::parse(raw).map_err(|_| HostProblem::Host)?;
        if !self.schemes.iter().any(|s| s == url.scheme()) {
            return Err(HostProblem::Scheme);
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(HostProblem::Host);
        }
        let host = url.host().ok_or(HostProblem::Host)?;
        let written = raw_host(raw).ok_or(HostProblem::Host)?;
        if !is_unambiguous_host(written, &host) {
            return Err(HostProblem::Host);
        }
        let explicit_port = url.port();
        let effective_port = url.port_or_known_default();
        let allowed = self.hosts.iter().any(|entry| {
            let port_ok = match entry.port {
                None => explicit_port.is_none(),
                Some(p) => effective_port == Some(p),
            };
            port_ok && entry.pattern.matches(&host)
        });
        if allowed {
            Ok(())
        } else {
            Err(HostProblem::Host)
        }
    }
}

impl HostPattern {
    fn matches(&self, host: &Host<&str>) -> bool {
        match (self, host) {
            (HostPattern::Exact(want), Host::Domain(d)) => want.eq_ignore_ascii_case(d),
            (HostPattern::Subdomains(suffix), Host::Domain(d)) => {
                d.len() > suffix.len()
                    && d.get(d.len() - suffix.len()..)
                        .is_some_and(|tail| tail.eq_ignore_ascii_case(suffix))
                    // The label before the suffix must be non-empty:
                    // `.example.com` alone is not a subdomain.
                    && !d.starts_with('.')
            }
            (HostPattern::Ip(IpAddr::V4(want)), Host::Ipv4(got)) => want == got,
            (HostPattern::Ip(IpAddr::V6(want)), Host::Ipv6(got)) => want == got,
            _ => false,
        }
    }
}

/// The host as written in `raw`: after `scheme://`, before the port and
/// the path. `None` when there is no `//` or there is userinfo (any `@`,
/// even with nothing before it).
fn raw_host(raw: &str) -> Option<&str> {
    let (_, rest) = raw.split_once(':')?;
    let rest = rest.strip_prefix("//")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = rest.get(..end)?;
    if authority.contains('@') {
        return None;
    }
    if authority.starts_with('[') {
        let close = authority.find(']')?;
        return authority.get(..=close);
    }
    Some(authority.split_once(':').map_or(authority, |(h, _)| h))
}

/// Whether the written host has one reading only: no percent-encoding, no
/// character NFKC would change, no invisible character, no trailing dot,
/// no label separator but `.`, and an IPv4 address only in its canonical
/// dotted-decimal form.
fn is_unambiguous_host(written: &str, parsed: &Host<&str>) -> bool {
    use unicode_normalization::UnicodeNormalization;
    if written.is_empty() || written.contains('%') || written.ends_with('.') {
        return false;
    }
    if !written.is_ascii()
        && (written
            .chars()
            .any(crate::provenance::normalise::is_invisible)
            || !written.nfkc().eq(written.chars()))
    {
        return false;
    }
    match parsed {
        Host::Ipv4(ip) => written == ip.to_string(),
        // IDNA maps `。` (U+3002) and `｡` (U+FF61) to a dot too: the labels
        // must be the ones written.
        Host::Domain(d) => written.split('.').count() == d.split('.').count(),
        Host::Ipv6(_) => true,
    }
}

/// What is wrong with a bundle entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostCompileError {
    /// A scheme outside `[a-z][a-z0-9+.-]*`.
    Scheme,
    /// A host entry, with the reason.
    Host(&'static str),
}

fn parse_entry(entry: &str) -> Result<HostEntry, &'static str> {
    if entry.is_empty() {
        return Err("host is empty");
    }
    if entry.contains("://") || entry.contains('/') || entry.contains('@') {
        return Err("write a bare host, not a url");
    }
    let (host, port) = split_port(entry)?;
    if let Some(rest) = host.strip_prefix('[') {
        let inner = rest
            .strip_suffix(']')
            .ok_or("unbalanced `[` in ipv6 host")?;
        let ip: Ipv6Addr = inner.parse().map_err(|_| "invalid ipv6 address")?;
        return Ok(HostEntry {
            pattern: HostPattern::Ip(IpAddr::V6(ip)),
            port,
        });
    }
    let (wildcard, name) = match host.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, host),
    };
    if name.contains('*') {
        return Err("`*` is only allowed as a whole first label (`*.example.com`)");
    }
    if name.ends_with('.') {
        return Err("remove the trailing dot");
    }
    let parsed = Host::parse(name).map_err(|_| "invalid host name")?;
    let pattern = match (wildcard, parsed) {
        (false, Host::Domain(d)) => HostPattern::Exact(d),
        (true, Host::Domain(d)) => {
            if !d.contains('.') {
                return Err("a wildcard needs at least two labels after `*.`");
            }
            HostPattern::Subdomains(format!(".{d}"))
        }
        (false, Host::Ipv4(ip)) => HostPattern::Ip(IpAddr::V4(ip)),
        (false, Host::Ipv6(ip)) => HostPattern::Ip(IpAddr::V6(ip)),
        (true, _) => return Err("a wildcard cannot apply to an ip address"),
    };
    Ok(HostEntry { pattern, port })
}

/// Split `host[:port]`; an IPv6 literal must be bracketed.
fn split_port(entry: &str) -> Result<(&str, Option<u16>), &'static str> {
    let (host, port) = if entry.starts_with('[') {
        match entry.rfind("]:") {
            Some(at) => (entry.get(..=at).unwrap_or(entry), entry.get(at + 2..)),
            None => (entry, None),
        }
    } else {
        match entry.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (entry, None),
        }
    };
    let port = match port {
        None => None,
        Some(p) => {
            let n: u16 = p
                .parse()
                .map_err(|_| "invalid port (bracket ipv6 addresses: `[::1]`)")?;
            if n == 0 {
                return Err("port 0 is not a port");
            }
            Some(n)
        }
    };
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(hosts: &[&str], schemes: &[&str]) -> HostAllow {
        let hosts: Vec<String> = hosts.iter().map(|s| s.to_string()).collect();
        let schemes: Vec<String> = schemes.iter().map(|s| s.to_string()).collect();
        HostAllow::compile(&hosts, &schemes).unwrap()
    }

    #[test]
    fn adversarial_urls() {
        let a = allow(&["uploads.example.com", "*.cdn.example.com"], &["https"]);
        let ok = [
            "https://uploads.example.com/file",
            "https://uploads.example.com",
            "https://UPLOADS.Example.COM/x",
            "https://uploads.example.com:443/x",
            "https://a.cdn.example.com/x",
            "https://a.b.cdn.example.com/x",
        ];
        for u in ok {
            assert_eq!(a.check(u), Ok(()), "{u}");
        }
        let host_bad = [
            "https://uploads.example.com@evil.com/",
            "https://evil.com@uploads.example.com/",
            "https://user:pw@uploads.example.com/",
            "https://uploads.example.com./x",
            "https://uploads.example.com:8443/x",
            "https://uploads.example.com.evil.com/x",
            "https://cdn.example.com/x",
            "https://xcdn.example.com/x",
            "https://93.184.216.34/x",
            "https://[::1]/x",
            "untrusted-service",
            "uploads.example.com/x",
            "//uploads.example.com/x",
            "https://uploads.example.com\\@evil.com/",
            // Userinfo of any kind, even empty.
            "https://@uploads.example.com/",
            "https://:@uploads.example.com/",
            "https://user@uploads.example.com/",
            // Percent-encoded hosts, which the parser would decode.
            "https://uploads%2Eexample.com/",
            "https://%75ploads.example.com/",
            "https://a.cdn.example%2Ecom/x",
            // Fullwidth and other compatibility dots, invisible characters.
            "https://uploads\u{ff0e}example.com/",
            "https://uploads\u{3002}example.com/",
            "https://uploads\u{ff61}example.com/",
            "https://uploads.example\u{ff0e}com/",
            "https://\u{ff55}ploads.example.com/",
            "https://uploads\u{200b}.example.com/",
            "https://uploads.example.com\u{ad}/",
            "https://a.cdn.example.com./x",
            // No `//`: the WHATWG parser would still find a host.
            "https:uploads.example.com/x",
            "https:/uploads.example.com/x",
            " https://uploads.example.com/",
            "https://uploads.example.com/\n",
            "",
        ];
        for u in host_bad {
            assert_eq!(a.check(u), Err(HostProblem::Host), "{u:?}");
        }
        for u in [
            "http://uploads.example.com/x",
            "ftp://uploads.example.com/x",
            "file:///etc/passwd",
            "javascript:alert(1)",
        ] {
            assert_eq!(a.check(u), Err(HostProblem::Scheme), "{u}");
        }
    }

    #[test]
    fn ip_literals_and_ports_only_when_listed() {
        let a = allow(
            &["10.0.0.7", "[2001:db8::1]:8443", "api.example.com:8080"],
            &["https", "http"],
        );
        assert_eq!(a.check("https://10.0.0.7/x"), Ok(()));
        // Odd IPv4 spellings, which the WHATWG parser would normalise and
        // another parser may read as a name, are refused.
        for odd in [
            "http://0x0a.0.0.7/",
            "http://012.0.0.7/",
            "http://167772167/",
            "http://10.7/",
            "http://10.0.0.7./",
        ] {
            assert_eq!(a.check(odd), Err(HostProblem::Host), "{odd}");
        }
        assert_eq!(a.check("https://10.0.0.8/x"), Err(HostProblem::Host));
        assert_eq!(a.check("https://[2001:db8::1]:8443/"), Ok(()));
        assert_eq!(a.check("https://[2001:db8::1]/"), Err(HostProblem::Host));
        assert_eq!(a.check("http://api.example.com:8080/"), Ok(()));
        assert_eq!(a.check("http://api.example.com/"), Err(HostProblem::Host));
        let b = allow(&["api.example.com:443"], &["https"]);
        assert_eq!(b.check("https://api.example.com/"), Ok(()));
        assert_eq!(b.check("https://api.example.com:443/"), Ok(()));
    }

    #[test]
    fn idn_hosts_compare_in_ascii() {
        let a = allow(&["bücher.example"], &["https"]);
        assert_eq!(a.check("https://BÜCHER.example/"), Ok(()));
        assert_eq!(a.check("https://xn--bcher-kva.example/"), Ok(()));
    }

    #[test]
    fn bad_entries_are_refused() {
        let bad = [
            "",
            "https://a.example.com",
            "a.example.com/x",
            "*.com",
            "*",
            "a.*.example.com",
            "*.10.0.0.1",
            "example.com.",
            "example.com:0",
            "example.com:http",
            "::1",
            "[::1",
            "bad host",
        ];
        for h in bad {
            assert!(
                HostAllow::compile(&[h.to_string()], &["https".to_string()]).is_err(),
                "{h:?}"
            );
        }
        for s in ["HTTPS", "", "1x", "ht tp"] {
            assert!(
                HostAllow::compile(&["a.example.com".to_string()], &[s.to_string()]).is_err(),
                "{s:?}"
            );
        }
    }
}
