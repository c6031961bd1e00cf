//! Small helpers: timestamps, hashing, JSON(L) file I/O.

use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Seconds since the Unix epoch (fractional).
pub fn unix_time(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// `YYYY-MM-DDTHH:MM:SSZ` (UTC) for a Unix time in seconds.
pub fn rfc3339_utc(unix_secs: f64) -> String {
    let secs = unix_secs.floor() as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Current time as RFC 3339 UTC plus the Unix time it was taken from.
pub fn now_stamp() -> (String, f64) {
    let t = unix_time(SystemTime::now());
    (rfc3339_utc(t), t)
}

// Howard Hinnant's days-from-civil inverse: proleptic Gregorian date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// SHA-256 of the decimal ids joined by `,` (the capture convention: `sha256(",".join(ids))`).
pub fn ids_sha256(ids: &[u32]) -> String {
    let joined = ids
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    sha256_hex(joined.as_bytes())
}

/// Read a whole file as UTF-8.
pub fn read_to_string(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

/// Write `value` as pretty JSON (with a trailing newline), creating parent directories.
pub fn write_json<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<()> {
    let mut s = serde_json::to_string_pretty(value).map_err(|e| Error::Json {
        what: path.display().to_string(),
        source: e,
    })?;
    s.push('\n');
    write_bytes(path, s.as_bytes())
}

/// Write one compact JSON document per line.
pub fn write_jsonl<T: Serialize>(path: &Path, rows: &[T]) -> Result<()> {
    let mut out = Vec::new();
    for r in rows {
        serde_json::to_writer(&mut out, r).map_err(|e| Error::Json {
            what: path.display().to_string(),
            source: e,
        })?;
        out.push(b'\n');
    }
    write_bytes(path, &out)
}

fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
    }
    let mut f = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    f.write_all(bytes).map_err(|e| Error::io(path, e))
}

/// A progress bar, hidden when `show` is false or `len` is zero.
pub fn progress_bar(len: u64, show: bool, label: &str) -> indicatif::ProgressBar {
    if !show || len == 0 {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{prefix} [{elapsed_precise}] {bar:40} {pos}/{len} ({eta} left)",
    ) {
        pb.set_style(style);
    }
    pb.set_prefix(label.to_string());
    pb
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_dates() {
        assert_eq!(rfc3339_utc(0.0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(951_782_400.0), "2000-02-29T00:00:00Z");
        assert_eq!(
            rfc3339_utc(1_798_588_800.0 + 3661.5),
            "2026-12-30T01:01:01Z"
        );
    }

    #[test]
    fn ids_hash_uses_comma_join() {
        // Python: hashlib.sha256(b"1,2,3").hexdigest()
        assert_eq!(
            ids_sha256(&[1, 2, 3]),
            "8a6ae15122001229edb8866f56e342af12ae8187203c3e3b33931743e7c0c48d"
        );
        assert_eq!(ids_sha256(&[]), sha256_hex(b""));
    }
}
