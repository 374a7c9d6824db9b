//! Agreement before a collective: every rank contributes its local outcome (ok + a key that
//! must be equal everywhere, or its error) and every rank learns all of them. A bad argument on
//! one rank thus becomes an error on every rank instead of a hang in the collective that
//! follows, and the rank at fault is named in every rank's message.

use dist_comm::AllGather;

use crate::boundary::{Error, Status};

/// Bytes of one rank's record: status (4), key (8), message length (2), message.
const RECORD: usize = 256;
const HEADER: usize = 14;

fn encode(local: &Result<u64, Error>) -> [u8; RECORD] {
    let mut record = [0u8; RECORD];
    let (status, key, message) = match local {
        Ok(key) => (Status::Ok, *key, ""),
        Err(e) => (e.status, 0, e.message.as_str()),
    };
    record[0..4].copy_from_slice(&(status as i32).to_le_bytes());
    record[4..12].copy_from_slice(&key.to_le_bytes());
    let mut len = message.len().min(RECORD - HEADER);
    while !message.is_char_boundary(len) {
        len -= 1;
    }
    record[12..14].copy_from_slice(&(len as u16).to_le_bytes());
    record[HEADER..HEADER + len].copy_from_slice(&message.as_bytes()[..len]);
    record
}

struct Decoded<'a> {
    status: i32,
    key: u64,
    message: std::borrow::Cow<'a, str>,
}

fn decode(record: &[u8]) -> Decoded<'_> {
    let word = |r: std::ops::Range<usize>| -> u64 {
        let mut b = [0u8; 8];
        b[..r.len()].copy_from_slice(&record[r]);
        u64::from_le_bytes(b)
    };
    let len = (word(12..14) as usize).min(RECORD - HEADER);
    Decoded {
        status: word(0..4) as u32 as i32,
        key: word(4..12),
        message: String::from_utf8_lossy(&record[HEADER..HEADER + len]),
    }
}

/// Collective over `comm`: shares `local` with every rank. Returns this rank's own error if it
/// has one; else [`Status::PeerFailed`] naming the first failing rank and its message; else
/// [`Status::ArgumentMismatch`] if the keys differ (described by `describe`, e.g. "F = 16");
/// else the common key.
pub(crate) fn agree<C: AllGather>(
    comm: &C,
    local: Result<u64, Error>,
    describe: impl Fn(u64) -> String,
) -> Result<u64, Error> {
    let records = comm.all_gather_vec(&encode(&local))?;
    let key = local?;
    let ranks: Vec<Decoded<'_>> = records.chunks_exact(RECORD).map(decode).collect();
    if let Some((rank, failed)) = ranks.iter().enumerate().find(|(_, d)| d.status != 0) {
        let status = Status::from_code(failed.status).unwrap_or(Status::Panic);
        return Err(Error::new(
            Status::PeerFailed,
            format!(
                "rank {rank} failed ({}): {}",
                status.description().to_string_lossy(),
                failed.message
            ),
        ));
    }
    if let Some((rank, other)) = ranks.iter().enumerate().find(|(_, d)| d.key != key) {
        return Err(Error::new(
            Status::ArgumentMismatch,
            format!(
                "rank {} has {} but rank {rank} has {}",
                comm.rank(),
                describe(key),
                describe(other.key)
            ),
        ));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dist_comm::{Group, LocalComm};

    #[test]
    fn all_ok_with_equal_keys_agrees() {
        let out = LocalComm::run(3, |comm| agree(&comm, Ok(16), |k| format!("F = {k}")));
        assert!(out.iter().all(|r| r == &Ok(16)));
    }

    #[test]
    fn one_failing_rank_fails_every_rank_with_its_message() {
        let out = LocalComm::run(3, |comm| {
            let local = if comm.rank() == 1 {
                Err(Error::invalid("ldx 3 < cols 4"))
            } else {
                Ok(4)
            };
            agree(&comm, local, |k| format!("F = {k}"))
        });
        assert_eq!(out[1], Err(Error::invalid("ldx 3 < cols 4")));
        for r in [0, 2] {
            let e = out[r].clone().unwrap_err();
            assert_eq!(e.status, Status::PeerFailed);
            assert!(e.message.contains("rank 1 failed"), "{}", e.message);
            assert!(e.message.ends_with("ldx 3 < cols 4"), "{}", e.message);
        }
    }

    #[test]
    fn different_keys_are_a_mismatch_on_every_rank() {
        let out = LocalComm::run(2, |comm| {
            agree(&comm, Ok(8 + comm.rank() as u64), |k| format!("F = {k}"))
        });
        for r in out {
            let e = r.unwrap_err();
            assert_eq!(e.status, Status::ArgumentMismatch);
            assert!(
                e.message.contains("F = 8") && e.message.contains("F = 9"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        let message = "é".repeat(400);
        let record = encode(&Err(Error::invalid(message)));
        let d = decode(&record);
        assert_eq!(d.status, Status::InvalidArgument as i32);
        assert!(d.message.chars().all(|c| c == 'é'));
        assert_eq!(d.message.len(), (RECORD - HEADER) / 2 * 2);
    }
}
