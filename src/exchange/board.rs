//! The node-local board: one shared-memory segment per rank in which the rank publishes, for every
//! channel it uses, how many exchange calls included the channel (its *step*) and its buffer
//! *version* at each step. Peers read it with plain atomic loads, so two ranks can agree on
//! whether a channel needs a store exchange without any store traffic.
//!
//! docs/PROTOCOL.md, section 4, gives the layout (magic `NVFIBRD4`), the publication order, why
//! two version slots suffice, how a waiter blocks on the `wake` futex word and is woken only when
//! it counts itself in `sleepers`, and the meaning of `closed` (set once, when the owner has
//! released every peer mapping and slab it held: from then on its peers import nothing of it).

use crate::error::{Error, Result};
use crate::fdpass::TrustedUids;
use crate::hash::Fnv1a;
use crate::node::{process_alive, NodeIdentity, PeerProcess};
use crate::os::shm::ShmSegment;
use crate::os::sigbus::{self, Guard};
use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

const MAGIC: u64 = u64::from_le_bytes(*b"NVFIBRD4");
const HEADER: u64 = 64;
const ENTRY: u64 = 256;
/// Peer allocations one entry can say its owner holds records of (as many as a cache keeps).
pub const KNOWN_PER_CHANNEL: usize = 8;
/// `at[i][3]` flag: the exporter sent no record of this version (see [`BufferAt`]).
const AT_KNOWN_TO_PEER: u64 = 1;
/// Channels one rank can publish (per cache): one per semaphore slot of its slab, so that a cache
/// runs out of channels before it runs out of semaphores.
pub const CAPACITY: u32 = crate::transport::slab::SLAB_SLOTS;
const BOARD_BYTES: u64 = HEADER + ENTRY * CAPACITY as u64;

/// The byte hashed before the description in the high half of a fingerprint.
const FINGERPRINT_SALT: u8 = 0x5a;

/// 128-bit fingerprint of a channel (two independent 64-bit FNV-1a hashes of its description).
pub fn fingerprint(description: &str) -> u128 {
    let mut f = Fingerprinter::new();
    f.write(description.as_bytes());
    f.finish()
}

/// [`fingerprint`] of a description fed in pieces, so that it is computed from the channel's
/// parts without formatting a string.
#[derive(Clone, Copy)]
pub(super) struct Fingerprinter {
    lo: Fnv1a,
    hi: Fnv1a,
}

impl Fingerprinter {
    pub(super) fn new() -> Fingerprinter {
        let mut hi = Fnv1a::new();
        hi.write_byte(FINGERPRINT_SALT);
        Fingerprinter {
            lo: Fnv1a::new(),
            hi,
        }
    }

    /// Appends `bytes` to the description.
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_byte(b);
        }
    }

    #[inline]
    fn write_byte(&mut self, b: u8) {
        self.lo.write_byte(b);
        self.hi.write_byte(b);
    }

    /// Appends the decimal digits of `n` (as `format!("{n}")` writes them).
    pub fn write_decimal(&mut self, n: u64) {
        if n >= 10 {
            self.write_decimal(n / 10);
        }
        self.write_byte(b'0' + (n % 10) as u8);
    }

    pub fn finish(self) -> u128 {
        (u128::from(self.hi.finish()) << 64) | u128::from(self.lo.finish())
    }
}

#[repr(C)]
struct Header {
    magic: AtomicU64,
    owner_pid: AtomicU32,
    rank: AtomicU32,
    capacity: AtomicU32,
    ready: AtomicU32,
    /// 1 once the owner has released everything it imported and is closing (see module docs).
    closed: AtomicU32,
    _reserved: u32,
    /// Inode of the owner's pid namespace: its pid is checked only from the same namespace.
    owner_pid_ns: AtomicU64,
    /// Peers blocked (or about to block) on `wake`.
    sleepers: AtomicU32,
    /// Bumped, and futex-woken, by a publish while `sleepers` is not zero.
    wake: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER as usize);
const _: () = assert!(std::mem::size_of::<Entry>() <= ENTRY as usize);

#[repr(C)]
struct Entry {
    state: AtomicU32,
    _pad: u32,
    fp_lo: AtomicU64,
    fp_hi: AtomicU64,
    step: AtomicU64,
    version: [AtomicU64; 2],
    /// The peer's buffer version that the owner has opened on this channel.
    opened: AtomicU64,
    /// Where the buffer of `version[i]` lies: allocation id, offset, bytes, flags.
    at: [[AtomicU64; 4]; 2],
    /// Allocation ids of the peer whose records the owner holds for this channel (0: none).
    known: [AtomicU64; KNOWN_PER_CHANNEL],
}

/// Where a channel's buffer lies in its exporter's allocation: enough for a peer that holds the
/// allocation's record to import the buffer without a store fetch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufferAt {
    /// The exporter's allocation id (`LocalBuffer::buffer_id`).
    pub alloc_id: u64,
    pub offset: u64,
    pub bytes: u64,
    /// The exporter sent no record: the importer holds the allocation's (its board said so).
    pub known_to_peer: bool,
}

/// Shared view of a mapped board (own or peer's), guarded against SIGBUS: an access past the end
/// of a file truncated under it reads zeros and marks it, which [`Table::check`], called at every
/// wait, turns into an error (docs/PROTOCOL.md, "A board truncated under its readers").
struct Table {
    /// Declared before `seg`: released before the segment is unmapped.
    guard: Guard,
    seg: ShmSegment,
    /// Entries that lie wholly inside the mapping (at most [`CAPACITY`]): every entry index is
    /// checked against it, in release builds too.
    entries: u32,
}

impl Table {
    /// Maps the header and the entries of `seg`; fails when the segment cannot hold the header.
    fn new(seg: ShmSegment) -> Result<Table> {
        let Some(body) = seg.len().checked_sub(HEADER) else {
            return Err(Error::protocol(format!(
                "board {} has {} bytes, less than its {HEADER}-byte header",
                seg.name(),
                seg.len()
            )));
        };
        let entries = (body / ENTRY).min(u64::from(CAPACITY)) as u32;
        let guard = sigbus::guard(seg.addr(), seg.len());
        Ok(Table {
            guard,
            seg,
            entries,
        })
    }

    /// Whether an access to the board ran into its file truncated or shrunk (one atomic load).
    /// With `probe`, the first and the last page are touched first, so that a shrink no access
    /// ran into yet is found too (to the page).
    fn truncated(&self, probe: bool) -> bool {
        if probe {
            std::hint::black_box(self.header().magic.load(Ordering::Relaxed));
            if let Some(last) = self.entries.checked_sub(1) {
                std::hint::black_box(
                    self.entry(last).known[KNOWN_PER_CHANNEL - 1].load(Ordering::Relaxed),
                );
            }
        }
        self.guard.truncated()
    }

    /// The error of a board found truncated; `whose` names it ("rank 3's board", ...), formatted
    /// only then (a warm call checks every board and must not allocate).
    fn check(&self, probe: bool, whose: std::fmt::Arguments<'_>, consequence: &str) -> Result<()> {
        if !self.truncated(probe) {
            return Ok(());
        }
        Err(Error::protocol(format!(
            "{whose} {} was truncated or shrunk under this process (a process of this uid \
             resized /dev/shm{}): its contents are lost, so {consequence}. Close the caches on \
             every rank of the job and create new ones, and find what resizes files in /dev/shm",
            self.seg.name(),
            self.seg.name()
        )))
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping holds at least HEADER bytes (checked in `new`), is page aligned
        // and lives as long as `self`; all fields are atomics, so concurrent access from other
        // processes is well defined, and a file truncated under the mapping reads zeros (the
        // SIGBUS guard).
        unsafe { &*(self.seg.addr() as *const Header) }
    }

    /// The entry at `index`. Panics when `index` is not an entry of this board: indexes come
    /// from [`OwnBoard::insert`] and [`PeerBoard::find`], so this is a bug of the caller, like an
    /// index out of a slice's bounds.
    fn entry(&self, index: u32) -> &Entry {
        assert!(
            index < self.entries,
            "board entry {index} out of bounds ({} entries)",
            self.entries
        );
        // SAFETY: as in `header`; `index < self.entries` keeps the whole entry inside the mapping
        // (checked above, in release builds too), and entries are 64-byte aligned (HEADER and
        // ENTRY are multiples of 64 from a page-aligned base).
        unsafe { &*((self.seg.addr() + HEADER + ENTRY * u64::from(index)) as *const Entry) }
    }

    /// The entries where `fp` may lie, in probing order.
    fn probe(&self, fp: u128) -> impl Iterator<Item = (u32, &Entry)> {
        let start = (fp as u64 % u64::from(CAPACITY)) as u32;
        (0..CAPACITY).map(move |i| {
            let index = (start + i) % CAPACITY;
            (index, self.entry(index))
        })
    }

    /// Finds the published entry of `fp`.
    fn find(&self, fp: u128) -> Option<u32> {
        let (lo, hi) = (fp as u64, (fp >> 64) as u64);
        for (index, e) in self.probe(fp) {
            if e.state.load(Ordering::Acquire) == 0 {
                return None;
            }
            if e.fp_lo.load(Ordering::Relaxed) == lo && e.fp_hi.load(Ordering::Relaxed) == hi {
                return Some(index);
            }
        }
        None
    }
}

/// A pid written by a process of pid namespace `ns` can be checked here only from that namespace
/// (0: unknown, never checked).
fn pid_checkable(ns: u64) -> bool {
    ns != 0 && ns == NodeIdentity::local().pid_ns
}

/// Removes the boards (`/dev/shm/nvfipc-...-b<rank>`) whose owner no longer exists (checked only
/// for owners of this pid namespace); returns how many. Their peers' mappings stay valid.
pub fn reclaim_dead() -> usize {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return 0;
    };
    let mut removed = 0;
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| crate::names::is_board_name(n)) else {
            continue;
        };
        let path = format!("/{name}");
        let Ok(Some(seg)) = ShmSegment::open_when_sized(&path, HEADER) else {
            continue;
        };
        let Ok(t) = Table::new(seg) else {
            continue;
        };
        let h = t.header();
        let pid = h.owner_pid.load(Ordering::Acquire);
        let dead = h.magic.load(Ordering::Relaxed) == MAGIC
            && pid != 0
            && pid_checkable(h.owner_pid_ns.load(Ordering::Relaxed))
            && !process_alive(pid);
        if dead {
            crate::os::shm::unlink_name(&path);
            removed += 1;
        }
    }
    removed
}

/// The board this rank owns and writes. Unlinked on drop.
pub struct OwnBoard {
    table: Table,
    /// Owner-side index (fingerprint -> entry) so inserts need no probing twice.
    index: Mutex<HashMap<u128, u32>>,
    /// Set once a board of this cache was found mapped without a SIGBUS guard (said once).
    unguarded_said: AtomicBool,
    /// The uids whose boards this cache believes (read once, when the cache is made).
    trusted: TrustedUids,
}

impl OwnBoard {
    /// Creates the board `name` for `rank`, replacing a stale board of a dead process (when one
    /// of the `trusted` uids owns it); the boards of peers are believed for the same uids.
    pub fn create(name: &str, rank: usize, trusted: TrustedUids) -> Result<OwnBoard> {
        let seg = match ShmSegment::create(name, BOARD_BYTES) {
            Ok(seg) => seg,
            Err(first) => {
                let Ok(Some(existing)) = ShmSegment::open(name, 0) else {
                    return Err(first.context(format!("creating the board of rank {rank}")));
                };
                check_owner(&existing, rank, &trusted)?;
                let h = Table::new(existing)
                    .map_err(|e| e.context(format!("replacing the board of rank {rank}")))?;
                let pid = h.header().owner_pid.load(Ordering::Acquire);
                if pid == std::process::id() {
                    return Err(Error::state(format!(
                        "board {name} of rank {rank} is already owned by another cache in this \
                         process: give each cache of a job its own scope"
                    )));
                }
                let ns = h.header().owner_pid_ns.load(Ordering::Acquire);
                if pid != 0 && (!pid_checkable(ns) || process_alive(pid)) {
                    return Err(Error::state(format!(
                        "board {name} of rank {rank} is owned by live process {pid}: two \
                         processes claim the same job id and rank"
                    )));
                }
                // A stale board of a dead process.
                drop(h);
                crate::os::shm::unlink_name(name);
                ShmSegment::create(name, BOARD_BYTES)?
            }
        };
        let table = Table::new(seg)?;
        let h = table.header();
        h.owner_pid.store(std::process::id(), Ordering::Relaxed);
        h.owner_pid_ns
            .store(NodeIdentity::local().pid_ns, Ordering::Relaxed);
        h.rank.store(rank as u32, Ordering::Relaxed);
        h.capacity.store(CAPACITY, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Relaxed);
        h.ready.store(1, Ordering::Release);
        let board = OwnBoard {
            table,
            index: Mutex::new(HashMap::new()),
            unguarded_said: AtomicBool::new(false),
            trusted,
        };
        board.warn_if_unguarded(&board.table);
        Ok(board)
    }

    /// The uids whose boards this cache believes.
    pub fn trusted(&self) -> &TrustedUids {
        &self.trusted
    }

    /// Warns, once per cache, that a board it maps has no SIGBUS guard.
    fn warn_if_unguarded(&self, t: &Table) {
        if !t.guard.is_guarded() && !self.unguarded_said.swap(true, Ordering::Relaxed) {
            log::warn!(
                target: crate::logging::EXCHANGE,
                "board {} is mapped without a SIGBUS guard (no SIGBUS handler, or more than {} \
                 boards mapped; said once): a process truncating it would kill this one",
                t.seg.name(),
                sigbus::MAX_RANGES
            );
        }
    }

    /// Warns, once per cache, that a peer's board it opened has no SIGBUS guard.
    pub fn check_guarded(&self, peer: &PeerBoard) {
        self.warn_if_unguarded(&peer.table);
    }

    /// Fails, naming the board, when its file was truncated or shrunk (see `Table::truncated`).
    pub fn check(&self, probe: bool) -> Result<()> {
        self.table.check(
            probe,
            format_args!("this rank's own board"),
            "its peers no longer see the steps and versions it publishes",
        )
    }

    /// Returns the entry of `fp`, publishing a new one (step 0) on first use.
    pub fn insert(&self, fp: u128) -> Result<u32> {
        let mut index = self.index.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&i) = index.get(&fp) {
            return Ok(i);
        }
        let mut probe = self.table.probe(fp);
        let Some((slot, e)) = probe.find(|(_, e)| e.state.load(Ordering::Relaxed) == 0) else {
            return Err(Error::state(format!(
                "the board is full ({CAPACITY} channels): use fewer distinct tags per cache"
            )));
        };
        e.fp_lo.store(fp as u64, Ordering::Relaxed);
        e.fp_hi.store((fp >> 64) as u64, Ordering::Relaxed);
        e.step.store(0, Ordering::Relaxed);
        e.opened.store(0, Ordering::Relaxed);
        e.state.store(1, Ordering::Release);
        index.insert(fp, slot);
        Ok(slot)
    }

    /// Publishes `version`, whose buffer lies `at`, at `step` of the channel at `entry`.
    pub fn publish(&self, entry: u32, step: u64, version: u64, at: BufferAt) {
        let e = self.table.entry(entry);
        let slot = (step & 1) as usize;
        let [alloc_id, offset, bytes, flags] = &e.at[slot];
        alloc_id.store(at.alloc_id, Ordering::Relaxed);
        offset.store(at.offset, Ordering::Relaxed);
        bytes.store(at.bytes, Ordering::Relaxed);
        let f = if at.known_to_peer {
            AT_KNOWN_TO_PEER
        } else {
            0
        };
        flags.store(f, Ordering::Relaxed);
        e.version[slot].store(version, Ordering::Release);
        e.step.store(step, Ordering::Release);
        self.wake_sleepers();
    }

    /// Publishes that this rank has opened the peer's buffer `version` on the channel at `entry`.
    pub fn publish_opened(&self, entry: u32, version: u64) {
        self.table
            .entry(entry)
            .opened
            .store(version, Ordering::Release);
        self.wake_sleepers();
    }

    /// Wakes the peers blocked on this board, if any: one fence and one load when none is.
    fn wake_sleepers(&self) {
        fence(Ordering::SeqCst);
        let h = self.table.header();
        if h.sleepers.load(Ordering::Relaxed) != 0 {
            h.wake.fetch_add(1, Ordering::SeqCst);
            crate::os::wait::futex_wake_all(&h.wake);
        }
    }

    /// Says which of the peer's allocations this rank holds records of for the channel at
    /// `entry` (at most [`KNOWN_PER_CHANNEL`]; the rest of the list is cleared).
    pub fn set_known(&self, entry: u32, alloc_ids: &[u64]) {
        let e = self.table.entry(entry);
        for (i, word) in e.known.iter().enumerate() {
            word.store(alloc_ids.get(i).copied().unwrap_or(0), Ordering::Release);
        }
    }

    /// Takes `alloc_id` off the list of the channel at `entry` (its mapping was released): the
    /// peer sends records of it through the store again.
    pub fn forget_known(&self, entry: u32, alloc_id: u64) {
        if alloc_id == 0 {
            return;
        }
        for word in &self.table.entry(entry).known {
            let _ = word.compare_exchange(alloc_id, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// The allocations listed for the channel at `entry` (see [`set_known`](Self::set_known)).
    pub fn known(&self, entry: u32) -> Vec<u64> {
        self.table
            .entry(entry)
            .known
            .iter()
            .map(|w| w.load(Ordering::Acquire))
            .filter(|&id| id != 0)
            .collect()
    }

    /// Tells the peers that this rank has released every mapping of theirs and is closing.
    pub fn mark_closed(&self) {
        self.table.header().closed.store(1, Ordering::SeqCst);
        // Orders the store before the loads of the peers' boards that follow (see module docs).
        fence(Ordering::SeqCst);
        self.wake_sleepers();
    }
}

/// A board is believed only when a trusted uid owns its file (the kernel's word): `/dev/shm` is
/// shared by every user, and anyone may create a file under a board's name first.
fn check_owner(seg: &ShmSegment, rank: usize, trusted: &TrustedUids) -> Result<()> {
    if trusted.admits(seg.owner()) {
        return Ok(());
    }
    Err(Error::protocol(format!(
        "the board {} of rank {rank} is a file of uid {}, not of {}: another user created it \
         under this job's name; it is not read. Remove it (as root or its owner) and give the \
         job a tag of its own (NVFIPC_JOB_TAG)",
        seg.name(),
        seg.owner(),
        trusted.describe()
    )))
}

/// A peer's board, mapped read-only in spirit (we never write it).
pub struct PeerBoard {
    table: Table,
    /// As found at the open (written once, before `ready`): still known after a truncation.
    owner: PeerProcess,
}

impl PeerBoard {
    /// Opens the board `name` if its owner has created it and is alive; `Ok(None)` otherwise. It
    /// is read only when one of the `trusted` uids owns it.
    pub fn try_open(name: &str, rank: usize, trusted: &TrustedUids) -> Result<Option<PeerBoard>> {
        // A board being created may still be empty: treat it as absent until it is sized.
        let Some(seg) = ShmSegment::open_when_sized(name, BOARD_BYTES)? else {
            return Ok(None);
        };
        check_owner(&seg, rank, trusted)?;
        let table = Table::new(seg)?;
        let h = table.header();
        if h.ready.load(Ordering::Acquire) != 1 {
            return Ok(None);
        }
        if h.magic.load(Ordering::Relaxed) != MAGIC
            || h.capacity.load(Ordering::Relaxed) != CAPACITY
        {
            return Err(Error::protocol(format!(
                "board {name} of rank {rank} has an unknown layout: all ranks must use the same \
                 nvfuser-ipc version"
            )));
        }
        if h.rank.load(Ordering::Relaxed) as usize != rank
            || (pid_checkable(h.owner_pid_ns.load(Ordering::Relaxed))
                && !process_alive(h.owner_pid.load(Ordering::Relaxed)))
        {
            // A board left behind by a crashed process; its owner will replace it.
            return Ok(None);
        }
        let owner = PeerProcess {
            rank,
            pid: h.owner_pid.load(Ordering::Relaxed),
            checkable: pid_checkable(h.owner_pid_ns.load(Ordering::Relaxed)),
        };
        Ok(Some(PeerBoard { table, owner }))
    }

    /// Fails, naming the board and its owner, when its file was truncated or shrunk.
    pub fn check(&self, probe: bool) -> Result<()> {
        self.table.check(
            probe,
            format_args!(
                "the board of peer rank {} (pid {})",
                self.owner.rank, self.owner.pid
            ),
            "the exchanges with that rank cannot continue",
        )
    }

    /// Finds the peer's entry of a channel (None until the peer first uses it).
    pub fn find(&self, fp: u128) -> Option<u32> {
        self.table.find(fp)
    }

    /// The peer's version at `step`, and where its buffer lies, once it has reached `step`.
    pub fn read(&self, entry: u32, step: u64) -> Option<(u64, BufferAt)> {
        let e = self.table.entry(entry);
        let peer_step = e.step.load(Ordering::Acquire);
        (peer_step >= step).then(|| {
            let slot = (step & 1) as usize;
            let [alloc_id, offset, bytes, flags] = &e.at[slot];
            let version = e.version[slot].load(Ordering::Acquire);
            let at = BufferAt {
                alloc_id: alloc_id.load(Ordering::Relaxed),
                offset: offset.load(Ordering::Relaxed),
                bytes: bytes.load(Ordering::Relaxed),
                known_to_peer: flags.load(Ordering::Relaxed) & AT_KNOWN_TO_PEER != 0,
            };
            (version, at)
        })
    }

    /// Whether the owner says it holds the record of this rank's allocation `alloc_id` for the
    /// channel at `entry` (then a buffer in it needs no record in the store).
    pub fn knows(&self, entry: u32, alloc_id: u64) -> bool {
        alloc_id != 0
            && self
                .table
                .entry(entry)
                .known
                .iter()
                .any(|w| w.load(Ordering::Acquire) == alloc_id)
    }

    /// Blocks, at most `max`, until the owner publishes something (or spuriously), unless
    /// `still_waiting` (called once this rank counts as a sleeper) says the wait is over.
    pub fn block(&self, max: Duration, still_waiting: impl FnOnce() -> bool) {
        let h = self.table.header();
        h.sleepers.fetch_add(1, Ordering::SeqCst);
        // Pairs with the owner's fence after a publish (see module docs).
        fence(Ordering::SeqCst);
        let seen = h.wake.load(Ordering::SeqCst);
        if still_waiting() {
            crate::os::wait::futex_wait(&h.wake, seen, max);
        }
        h.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// The version of this rank's buffer that the peer has opened on the channel at `entry`.
    pub fn opened(&self, entry: u32) -> u64 {
        self.table.entry(entry).opened.load(Ordering::Acquire)
    }

    /// The peer's current step of `entry` (for messages).
    pub fn step(&self, entry: u32) -> u64 {
        self.table.entry(entry).step.load(Ordering::Acquire)
    }

    /// Whether the owner has marked itself closed (it must not be imported from).
    pub fn closed(&self) -> bool {
        // Orders this rank's earlier stores (e.g. its own `closed`) before the load.
        fence(Ordering::SeqCst);
        self.table.header().closed.load(Ordering::SeqCst) != 0
    }

    /// The owner as a process whose liveness can be checked where its pid is meaningful (a
    /// zombie counts as dead).
    pub fn owner(&self) -> PeerProcess {
        self.owner
    }
}

impl crate::departures::Presence for PeerBoard {
    fn left(&self) -> Option<String> {
        let (rank, pid) = (self.owner.rank, self.owner.pid);
        if self.closed() {
            Some(format!("rank {rank} (pid {pid}) closed its cache"))
        } else if self.owner.is_dead() {
            Some(format!("rank {rank} (pid {pid}) has exited"))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests;
