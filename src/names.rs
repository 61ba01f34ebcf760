//! Every name the library gives a job's shared state, made here and nowhere else: the job tag,
//! the `/dev/shm` names of boards and segments, and the store keys of records and node
//! identities. Both the transports (segment names) and the exchange (boards, keys) use them.

use crate::transport::record::fnv1a64;

/// Turns a job id into the short, name-safe tag used in shm names (at most 16 characters of
/// `[A-Za-z0-9_]`, or a hash when the id has other characters or is longer).
pub fn job_tag(job_id: &str) -> String {
    let safe = !job_id.is_empty()
        && job_id.len() <= 16
        && job_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if safe {
        job_id.to_string()
    } else {
        format!("{:016x}", fnv1a64(job_id.as_bytes()))
    }
}

/// The shm-name prefix of everything this library creates for `job_id` in any process
/// (e.g. `nvfipc-job1-`; `/dev/shm` entries have no leading slash).
pub fn job_prefix(job_id: &str) -> String {
    format!("nvfipc-{}-", job_tag(job_id))
}

/// Shm name of the board of `rank` for a job and scope (`/nvfipc-<job>[-<scope>]-b<rank>`).
pub fn board_name(job_id: &str, scope: &str, rank: usize) -> String {
    if scope.is_empty() {
        format!("/nvfipc-{}-b{rank}", job_tag(job_id))
    } else {
        format!("/nvfipc-{}-{}-b{rank}", job_tag(job_id), job_tag(scope))
    }
}

/// Whether a `/dev/shm` entry (no leading slash) is named like a board (see [`board_name`]).
pub fn is_board_name(entry: &str) -> bool {
    entry.starts_with("nvfipc-")
        && entry
            .rsplit_once("-b")
            .is_some_and(|(_, r)| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
}

/// Store key of the record that `exporter` published at buffer `version` on the channel
/// described by `channel` (`src/dst/tag#occurrence`). Unique per (channel, exporter, version),
/// so a newer export never overwrites an unread one.
pub fn record_key(
    job_id: &str,
    scope: &str,
    channel: (usize, usize, &str, u32),
    exporter: usize,
    version: u64,
) -> String {
    let (src, dst, tag, occurrence) = channel;
    format!("nvfipc/{job_id}/{scope}/h/{src}/{dst}/{exporter}/{version}/{tag}#{occurrence}")
}

/// The store prefix under which the fd transport of a job publishes each rank's responder
/// (`<prefix>/fdpass/<rank>`, see `crate::fdpass`).
pub fn fdpass_prefix(job_id: &str) -> String {
    format!("nvfipc/{job_id}")
}

/// The store key where `rank`'s cache of a job and scope publishes its node identity.
pub fn node_key(job_id: &str, scope: &str, rank: usize) -> String {
    format!("nvfipc/{job_id}/{scope}/node/{rank}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_tags_are_name_safe() {
        assert_eq!(job_tag("abc_1"), "abc_1");
        assert_eq!(job_tag("a/b").len(), 16);
        assert_eq!(job_tag("").len(), 16);
        assert_eq!(job_tag(&"x".repeat(40)).len(), 16);
    }

    #[test]
    fn boards_are_told_apart_from_other_segments() {
        assert!(is_board_name(&board_name("job", "", 3)[1..]));
        assert!(is_board_name(&board_name("job", "sc", 12)[1..]));
        assert!(!is_board_name("nvfipc-job-b"));
        assert!(!is_board_name("nvfipc-job-1n2-7"));
        assert!(!is_board_name("other-b3"));
    }
}
