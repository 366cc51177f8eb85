//! Go's `time.Duration` text, as kube-proxy's flags and configuration file carry durations.

use std::{fmt::Write as _, time::Duration};

/// Why a duration does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidDuration {
    /// The text is not a Go duration (`1h30m`, `500ms`, `1.5s`).
    #[error("not a duration (expected e.g. 30s, 1m, 500ms, 1h30m)")]
    Malformed,
    /// A number has no unit.
    #[error("missing unit (one of ns, us, ms, s, m, h)")]
    MissingUnit,
    /// A unit is not one of Go's.
    #[error("unknown unit {0:?} (one of ns, us, ms, s, m, h)")]
    UnknownUnit(String),
    /// The duration is below zero.
    #[error("must not be negative")]
    Negative,
    /// The duration does not fit Go's range (about 292 years).
    #[error("too long")]
    Overflow,
}

/// Parses a duration in Go's `time.ParseDuration` syntax, as kube-proxy's flags take it: an
/// optional sign, then one or more decimal numbers each with a unit (`ns`, `us`/`µs`, `ms`, `s`,
/// `m`, `h`), e.g. `30s`, `1m`, `500ms`, `1h30m`, `1.5h`; `0` needs no unit.
///
/// # Errors
///
/// Returns [`InvalidDuration`] for anything else, for negative durations and for durations
/// beyond Go's range.
pub fn parse_duration(text: &str) -> Result<Duration, InvalidDuration> {
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(InvalidDuration::Malformed);
    }
    let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let (whole, after) = rest.split_at(digits(rest));
        let (fraction, after) = match after.strip_prefix('.') {
            Some(after) => after.split_at(digits(after)),
            None => ("", after),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(InvalidDuration::Malformed);
        }
        let unit_len = after
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "" => return Err(InvalidDuration::MissingUnit),
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 60 * 60 * 1_000_000_000,
            other => return Err(InvalidDuration::UnknownUnit(other.to_owned())),
        };
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| InvalidDuration::Overflow)?
        };
        // Digits past the 18th are below a nanosecond of any unit; drop them as Go does.
        let fraction = &fraction[..fraction.len().min(18)];
        let fraction_nanos = if fraction.is_empty() {
            0
        } else {
            let value: u128 = fraction.parse().map_err(|_| InvalidDuration::Malformed)?;
            value * unit_nanos / 10u128.pow(u32::try_from(fraction.len()).unwrap_or(18))
        };
        nanos = whole
            .checked_mul(unit_nanos)
            .and_then(|n| n.checked_add(fraction_nanos))
            .and_then(|n| n.checked_add(nanos))
            .ok_or(InvalidDuration::Overflow)?;
        rest = after;
    }
    let nanos = u64::try_from(nanos)
        .ok()
        .filter(|n| i64::try_from(*n).is_ok())
        .ok_or(InvalidDuration::Overflow)?;
    if negative && nanos > 0 {
        return Err(InvalidDuration::Negative);
    }
    Ok(Duration::from_nanos(nanos))
}

/// Formats a duration as Go's `time.Duration.String` does, as kube-proxy writes durations into
/// its configuration file: `0s`, `500ms`, `1.5s`, `30s`, `1m0s`, `24h0m0s`.
#[must_use]
pub fn format_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos < 1_000_000_000 {
        let (unit, scale) = match nanos {
            0..1_000 => ("ns", 1),
            1_000..1_000_000 => ("\u{b5}s", 1_000),
            _ => ("ms", 1_000_000),
        };
        return format!("{}{unit}", decimal(nanos, scale));
    }
    let seconds = duration.as_secs();
    let (hours, minutes) = (seconds / 3600, seconds / 60 % 60);
    let mut text = String::new();
    if hours > 0 {
        let _ = write!(text, "{hours}h");
    }
    if hours > 0 || minutes > 0 {
        let _ = write!(text, "{minutes}m");
    }
    let rest = u128::from(seconds % 60) * 1_000_000_000 + u128::from(duration.subsec_nanos());
    let _ = write!(text, "{}s", decimal(rest, 1_000_000_000));
    text
}

/// `value / scale` in decimal, without trailing zeros in the fraction.
fn decimal(value: u128, scale: u128) -> String {
    let (whole, fraction) = (value / scale, value % scale);
    if fraction == 0 {
        return whole.to_string();
    }
    let width = scale.ilog10() as usize;
    let fraction = format!("{fraction:0width$}");
    format!("{whole}.{}", fraction.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse() {
        let ms = Duration::from_millis;
        let s = Duration::from_secs;
        for (text, expected) in [
            ("30s", s(30)),
            ("1m", s(60)),
            ("500ms", ms(500)),
            ("1h30m", s(5400)),
            ("2h45m30.5s", ms((2 * 3600 + 45 * 60 + 30) * 1000 + 500)),
            ("1.5h", s(5400)),
            (".5s", ms(500)),
            ("1.s", s(1)),
            ("+2s", s(2)),
            ("0", Duration::ZERO),
            ("-0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("100ns", Duration::from_nanos(100)),
            ("3us", Duration::from_micros(3)),
            ("3\u{b5}s", Duration::from_micros(3)),
            ("3\u{3bc}s", Duration::from_micros(3)),
            ("1m0.000000001s", Duration::new(60, 1)),
            (
                "0.1234567891234567891234s",
                Duration::from_nanos(123_456_789),
            ),
        ] {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn malformed_go_durations_are_refused() {
        for (text, expected) in [
            ("", InvalidDuration::Malformed),
            ("-", InvalidDuration::Malformed),
            ("s", InvalidDuration::Malformed),
            (".s", InvalidDuration::Malformed),
            ("1", InvalidDuration::MissingUnit),
            ("1.5.3s", InvalidDuration::MissingUnit),
            ("1h30", InvalidDuration::MissingUnit),
            ("10x", InvalidDuration::UnknownUnit("x".into())),
            ("1 s", InvalidDuration::UnknownUnit(" s".into())),
            ("1d", InvalidDuration::UnknownUnit("d".into())),
            ("-1s", InvalidDuration::Negative),
            ("3000000h", InvalidDuration::Overflow),
            (
                "99999999999999999999999999999999999999999s",
                InvalidDuration::Overflow,
            ),
        ] {
            assert_eq!(parse_duration(text), Err(expected), "{text:?}");
        }
    }

    #[test]
    fn durations_format_as_go_prints_them() {
        for (duration, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(100), "100ns"),
            (Duration::from_micros(3), "3\u{b5}s"),
            (Duration::from_micros(1500), "1.5ms"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_secs(60), "1m0s"),
            (Duration::from_secs(15 * 60), "15m0s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_secs(24 * 3600), "24h0m0s"),
            (Duration::new(5430, 1), "1h30m30.000000001s"),
        ] {
            assert_eq!(format_duration(duration), text);
            assert_eq!(parse_duration(text), Ok(duration), "{text} reads back");
        }
    }
}
