//! HTML building: escaping, timestamps, the page frame.

use std::fmt::Write as _;

use warden_core::decision::Subject;
use warden_core::time::Timestamp;

use super::reasons::explain;
use super::session::Viewer;

/// `s` with `& < > " '` escaped: safe in text and in quoted attributes.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A path segment or query value, percent-encoded (unreserved characters
/// kept).
pub(crate) fn url_part(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub(crate) fn time(t: Timestamp) -> String {
    let ms = t.0;
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Who, in words.
pub(crate) fn who(s: &Subject) -> String {
    match s {
        Subject::Operator => "the operator".to_owned(),
        Subject::Agent(a) => format!("agent {a}"),
    }
}

/// A reason code with its plain-language text.
pub(crate) fn reason(code: &str) -> String {
    let words = explain(code);
    if words == code {
        return format!("<span class=\"reason\"><code>{}</code></span>", esc(code));
    }
    format!(
        "<span class=\"reason\"><code>{}</code> <span class=\"explain\">{}</span></span>",
        esc(code),
        esc(&words)
    )
}

/// A verdict as a badge.
pub(crate) fn verdict(v: &str) -> String {
    format!("<span class=\"badge v-{0}\">{0}</span>", esc(v))
}

/// The hidden CSRF field of a form.
pub(crate) fn csrf_field(v: &Viewer) -> String {
    format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        esc(&v.csrf)
    )
}

/// Which section of the navigation a page belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Section {
    Escalations,
    Hierarchy,
    Memory,
    Sessions,
    Audit,
    None,
}

/// The whole page around `body`.
pub(crate) fn page(viewer: Option<&Viewer>, section: Section, title: &str, body: &str) -> String {
    let mut nav = String::new();
    if let Some(v) = viewer {
        let items: &[(Section, &str, &str, char)] = &[
            (
                Section::Escalations,
                "/console/escalations",
                "Escalations",
                'e',
            ),
            (Section::Hierarchy, "/console/agents", "Hierarchy", 'h'),
            (Section::Memory, "/console/memory", "Memory", 'm'),
            (Section::Sessions, "/console/sessions", "Sessions", 's'),
            (Section::Audit, "/console/audit", "Audit", 'a'),
        ];
        nav.push_str("<nav aria-label=\"Sections\"><ul>");
        for (s, href, label, key) in items {
            if *s == Section::Audit && !v.is_operator() {
                continue;
            }
            let current = if *s == section {
                " aria-current=\"page\""
            } else {
                ""
            };
            let _ = write!(
                nav,
                "<li><a href=\"{href}\" data-key=\"{key}\"{current}>{label}</a></li>"
            );
        }
        nav.push_str("</ul></nav>");
        let _ = write!(
            nav,
            "<div class=\"me\"><span>Signed in as <strong>{}</strong>{}</span>\
             <form method=\"post\" action=\"/console/sign-out\">{}<button type=\"submit\">Sign out</button></form></div>",
            esc(&who(&v.caller)),
            if v.is_operator() { "" } else { " (read-only)" },
            csrf_field(v)
        );
    }
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · Warden console</title>\
         <link rel=\"stylesheet\" href=\"/console/assets/console.css\">\
         <script src=\"/console/assets/console.js\" defer></script></head>\
         <body><a class=\"skip\" href=\"#main\">Skip to content</a>\
         <header><span class=\"brand\">Warden</span>{nav}</header>\
         <main id=\"main\" tabindex=\"-1\"><h1>{}</h1>{body}</main></body></html>\n",
        esc(title),
        esc(title)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn formats_epoch_milliseconds_as_utc() {
        assert_eq!(time(Timestamp(0)), "1970-01-01 00:00:00 UTC");
        assert_eq!(
            time(Timestamp(1_709_210_096_000)),
            "2024-02-29 12:34:56 UTC"
        );
    }

    #[test]
    fn encodes_url_parts() {
        assert_eq!(url_part("a b/c?d"), "a%20b%2Fc%3Fd");
        assert_eq!(url_part("esc-1.a_b"), "esc-1.a_b");
    }
}
