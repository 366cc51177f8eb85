//! What a name on the wire may be: the Kubernetes names the API server admits, so a name can
//! go into a kernel rule (an iptables comment, a chain hash) without quoting or escaping.

/// The longest DNS label (RFC 1123), and so the longest namespace, Service or port name.
pub const MAX_LABEL_LENGTH: usize = 63;

/// Whether `text` is a DNS-1123 label: 1 to 63 lowercase letters, digits and `-`, starting and
/// ending with a letter or digit. Namespaces, Service names and Service port names are such
/// labels in the API server (Service names even stricter: they start with a letter).
#[must_use]
pub fn is_dns_label(text: &str) -> bool {
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=MAX_LABEL_LENGTH).contains(&text.len())
        && text.chars().all(|c| alphanumeric(c) || c == '-')
        && text.starts_with(alphanumeric)
        && text.ends_with(alphanumeric)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels_are_short_lowercase_and_quote_free() {
        for good in ["a", "web", "kube-system", "p80", "0abc", &"x".repeat(63)] {
            assert!(is_dns_label(good), "{good:?}");
        }
        for bad in [
            "",
            &"x".repeat(64),
            "Web",
            "-web",
            "web-",
            "we b",
            "web\"",
            "web\n-A INPUT -j ACCEPT",
            "wéb",
            "a.b",
        ] {
            assert!(!is_dns_label(bad), "{bad:?}");
        }
    }
}
