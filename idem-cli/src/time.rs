//! Store times (milliseconds since the Unix epoch, by the database's
//! clock) as RFC 3339 and relative to the database's now.

/// `millis` as RFC 3339 in UTC, to the millisecond:
/// `2024-05-01T10:00:00.123Z`.
pub(crate) fn rfc3339(millis: i64) -> String {
    let secs = millis.div_euclid(1000);
    let ms = millis.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let of_day = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// The proleptic Gregorian date of a day counted from 1970-01-01
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A span of milliseconds in the largest unit that keeps it readable:
/// `40 s`, `12 min`, `23 h`, `3 d`.
pub(crate) fn span(millis: i64) -> String {
    let ms = millis.unsigned_abs();
    let s = ms / 1000;
    match s {
        0 => format!("{ms} ms"),
        1..=89 => format!("{s} s"),
        90..=5_399 => format!("{} min", (s + 30) / 60),
        5_400..=172_799 => format!("{} h", (s + 1800) / 3600),
        _ => format!("{} d", (s + 43_200) / 86_400),
    }
}

/// `at` relative to `now`: `in 23 h` or `12 min ago`.
pub(crate) fn relative(at: i64, now: i64) -> String {
    if at >= now {
        format!("in {}", span(at - now))
    } else {
        format!("{} ago", span(now - at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_714_557_600_000), "2024-05-01T10:00:00.000Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn spans() {
        assert_eq!(relative(1_000 + 23 * 3_600_000, 1_000), "in 23 h");
        assert_eq!(relative(0, 12 * 60_000), "12 min ago");
        assert_eq!(span(400), "400 ms");
        assert_eq!(span(40_000), "40 s");
        assert_eq!(span(3 * 86_400_000), "3 d");
    }
}
