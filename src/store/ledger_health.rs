//! Telling a damaged ledger from a healthy one, before SQLite hides it.
//!
//! SQLite reads a write-ahead log (`ledger.db-wal`) only up to its first
//! frame that fails its checksum, and ignores a log whose header is not its
//! own. That is right for the torn tail a crash leaves, but it turns a
//! damaged log into a silently shorter ledger: cairn would forget results
//! it recorded and run their stages again as if nothing had happened. So
//! before the ledger is opened the log is read here, and these are damage:
//!
//! | what is found                                            | what it means                  |
//! |----------------------------------------------------------|--------------------------------|
//! | a non-empty log whose header is not SQLite's, or whose    | the whole log is unreadable    |
//! | header checksum fails                                    |                                |
//! | after the first unreadable frame, a frame of the same    | committed results would be     |
//! | generation (same salts) that ends a transaction          | dropped                        |
//!
//! A log that simply stops — frames of an older generation, or an
//! unfinished transaction — is what a crash leaves and is not damage. Nor
//! can a log garbled from some frame to its very end be told from one that
//! a crash of the machine cut short: SQLite then drops the transactions
//! after that frame, and cairn runs their stages again.
//! Damage inside `ledger.db` itself SQLite reports as "file is not a
//! database" or "database disk image is malformed";
//! [`StoreError::db`](super::StoreError::db) turns those into
//! [`StoreError::LedgerDamaged`](super::StoreError::LedgerDamaged).

use std::io::{self, Read};
use std::path::Path;

use super::StoreError;

const WAL_HEADER: usize = 32;
const FRAME_HEADER: usize = 24;

/// Checks the write-ahead log beside `ledger`, if there is one.
pub fn check_wal(ledger: &Path) -> Result<(), StoreError> {
    let mut wal = ledger.as_os_str().to_owned();
    wal.push("-wal");
    let wal = std::path::PathBuf::from(wal);
    let file = match crate::fingerprint::open_regular(&wal) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StoreError::io(&wal, e)),
    };
    // Read in large pieces: a log holds up to a thousand 4 KiB pages
    // (SQLite checkpoints at that size), and read 8 KiB at a time its
    // system calls were most of the check.
    match wal_damage(io::BufReader::with_capacity(256 << 10, file)) {
        Ok(None) => Ok(()),
        Ok(Some(detail)) => Err(StoreError::LedgerWalDamaged { path: wal, detail }),
        Err(e) => Err(StoreError::io(&wal, e)),
    }
}

/// What is wrong with a write-ahead log, if anything (see the module doc).
/// Checks no further than it must (reading at most one buffer beyond): a
/// healthy log ends at its first frame of an older generation.
fn wal_damage(mut log: impl Read) -> io::Result<Option<String>> {
    let mut header = [0u8; WAL_HEADER];
    match read_full(&mut log, &mut header)? {
        0 => return Ok(None),
        n if n < WAL_HEADER => {
            return Ok(Some(format!("{n} bytes, shorter than a log header")));
        }
        _ => {}
    }
    let big_endian = match be32(&header, 0) {
        0x377f_0682 => false,
        0x377f_0683 => true,
        _ => {
            return Ok(Some(
                "its header is not an SQLite write-ahead log header".to_owned(),
            ));
        }
    };
    let header_sum = checksum((0, 0), &header[..24], big_endian);
    if header_sum != (be32(&header, 24), be32(&header, 28)) {
        return Ok(Some("its header checksum does not match".to_owned()));
    }
    let page_size = match be32(&header, 8) {
        1 => 65536,
        n if (512..=65536).contains(&n) && n.is_power_of_two() => n as usize,
        n => {
            return Ok(Some(format!(
                "its header gives an impossible page size {n}"
            )));
        }
    };
    let salts = &header[16..24];
    let mut frame = vec![0u8; FRAME_HEADER + page_size];
    let mut sum = header_sum;
    let mut unreadable_from = None;
    for index in 0.. {
        if read_full(&mut log, &mut frame)? < frame.len() {
            return Ok(None);
        }
        let same_generation = &frame[8..16] == salts;
        match unreadable_from {
            None => {
                let next = checksum(
                    checksum(sum, &frame[..8], big_endian),
                    &frame[FRAME_HEADER..],
                    big_endian,
                );
                let readable = same_generation
                    && be32(&frame, 0) != 0
                    && next == (be32(&frame, 16), be32(&frame, 20));
                if readable {
                    sum = next;
                } else if same_generation {
                    unreadable_from = Some(index);
                } else {
                    // An older generation: the log ends here.
                    return Ok(None);
                }
            }
            Some(first) => {
                let commits = be32(&frame, 4) != 0;
                if same_generation && commits {
                    return Ok(Some(format!(
                        "frame {} cannot be read but committed frame {} follows it",
                        first + 1,
                        index + 1
                    )));
                }
            }
        }
    }
    Ok(None)
}

/// Fills `buf` as far as the log goes; the number of bytes read.
fn read_full(log: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match log.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn be32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// SQLite's write-ahead log checksum over `data` (a multiple of 8 bytes),
/// continuing from `(s0, s1)`.
fn checksum((mut s0, mut s1): (u32, u32), data: &[u8], big_endian: bool) -> (u32, u32) {
    let word = |chunk: &[u8]| {
        let array = [chunk[0], chunk[1], chunk[2], chunk[3]];
        if big_endian {
            u32::from_be_bytes(array)
        } else {
            u32::from_le_bytes(array)
        }
    };
    for pair in data.chunks_exact(8) {
        s0 = s0.wrapping_add(word(&pair[..4])).wrapping_add(s1);
        s1 = s1.wrapping_add(word(&pair[4..])).wrapping_add(s0);
    }
    (s0, s1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn damage(bytes: &[u8]) -> Option<String> {
        wal_damage(bytes).unwrap()
    }

    /// A log of `pages` single-frame transactions, as SQLite writes it.
    fn wal(pages: u32, big_endian: bool) -> Vec<u8> {
        let page_size = 512usize;
        let mut bytes = Vec::new();
        let magic: u32 = if big_endian { 0x377f_0683 } else { 0x377f_0682 };
        for value in [
            magic,
            3_007_000,
            page_size as u32,
            0,
            0x1234_5678,
            0x9abc_def0,
        ] {
            bytes.extend_from_slice(&value.to_be_bytes());
        }
        let mut sum = checksum((0, 0), &bytes, big_endian);
        bytes.extend_from_slice(&sum.0.to_be_bytes());
        bytes.extend_from_slice(&sum.1.to_be_bytes());
        for page in 1..=pages {
            let mut header = Vec::new();
            header.extend_from_slice(&page.to_be_bytes());
            header.extend_from_slice(&page.to_be_bytes()); // commits
            let data = vec![page as u8; page_size];
            sum = checksum(checksum(sum, &header, big_endian), &data, big_endian);
            header.extend_from_slice(&bytes[16..24]);
            header.extend_from_slice(&sum.0.to_be_bytes());
            header.extend_from_slice(&sum.1.to_be_bytes());
            bytes.extend_from_slice(&header);
            bytes.extend_from_slice(&data);
        }
        bytes
    }

    #[test]
    fn healthy_logs_in_either_byte_order_are_not_damage() {
        assert_eq!(damage(&wal(3, false)), None);
        assert_eq!(damage(&wal(3, true)), None);
        assert_eq!(damage(&[]), None);
    }

    #[test]
    fn a_torn_last_frame_is_what_a_crash_leaves_not_damage() {
        let mut bytes = wal(3, false);
        let len = bytes.len();
        bytes[len - 10] ^= 0xff;
        assert_eq!(damage(&bytes), None);
        bytes.truncate(len - 100);
        assert_eq!(damage(&bytes), None);
    }

    #[test]
    fn a_damaged_frame_before_a_committed_one_is_damage() {
        let mut bytes = wal(3, false);
        bytes[WAL_HEADER + FRAME_HEADER + 10] ^= 0xff;
        let detail = damage(&bytes).unwrap();
        assert!(detail.contains("frame 1"), "{detail}");
    }

    #[test]
    fn frames_of_an_older_generation_end_the_log_and_are_not_read() {
        // After a checkpoint, SQLite writes the log again from its start
        // with new salts; what follows the new frames is the old log.
        let mut bytes = wal(3, false);
        let frame_len = FRAME_HEADER + 512;
        let second = WAL_HEADER + frame_len;
        bytes[second + 8] ^= 0xff;
        bytes[second + frame_len + FRAME_HEADER] ^= 0xff;
        assert_eq!(damage(&bytes), None);
    }

    #[test]
    fn a_garbage_header_is_damage() {
        let mut bytes = wal(1, false);
        bytes[0] = 0;
        assert!(damage(&bytes).is_some());
        let mut bytes = wal(1, false);
        bytes[20] ^= 1;
        assert!(damage(&bytes).unwrap().contains("checksum"));
    }
}
