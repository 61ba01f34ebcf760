use super::*;
use crate::host::alloc::alloc_for_job;
use crate::host::slab::new_slab;
use crate::transport::epoch::TransferEpochs;
use crate::transport::SemaphoreSlab;
use std::sync::Arc;

/// Two sides in one process over one slab: enough to check the protocol's values.
fn pair(src: u64, dst: u64, bytes: u64, slab: &SemaphoreSlab) -> (P2pHandles, P2pHandles) {
    let s_sem = slab.local(slab.allocate_slot().unwrap()).unwrap();
    let r_sem = slab.local(slab.allocate_slot().unwrap()).unwrap();
    let send = P2pHandles {
        kind: MemKind::Host,
        local_ptr: src,
        local_bytes: bytes,
        local_semaphore: s_sem,
        peer_ptr: dst,
        peer_bytes: bytes,
        peer_semaphore: r_sem,
        epochs: Arc::new(TransferEpochs::default()),
        peer: crate::node::PeerProcess {
            rank: 1,
            pid: std::process::id(),
            checkable: true,
        },
    };
    let recv = P2pHandles {
        kind: MemKind::Host,
        local_ptr: dst,
        local_bytes: bytes,
        local_semaphore: r_sem,
        peer_ptr: src,
        peer_bytes: bytes,
        peer_semaphore: s_sem,
        epochs: Arc::new(TransferEpochs::default()),
        peer: crate::node::PeerProcess {
            rank: 1,
            pid: std::process::id(),
            checkable: true,
        },
    };
    (send, recv)
}

#[test]
fn transfers_in_order_and_tolerates_a_sender_running_ahead() {
    let slab = new_slab("unit_p2p", crate::host::tests::fdpass_pair("unit_p2p").0).unwrap();
    let a = alloc_for_job("unit_p2p", 8).unwrap();
    let b = alloc_for_job("unit_p2p", 8).unwrap();
    let (send, recv) = pair(a.addr(), b.addr(), 8, &slab);
    let t = Duration::from_secs(5);
    assert!(send_wait(&send, t).is_err(), "nothing posted yet");
    a.write(0, &1u64.to_le_bytes()).unwrap();
    assert_eq!(send_post(&send).unwrap(), 1);
    assert_eq!(recv_post(&recv, 8, t).unwrap(), 1);
    assert_eq!(send_wait(&send, t).unwrap(), 1);
    let mut out = [0u8; 8];
    b.read(0, &mut out).unwrap();
    assert_eq!(u64::from_le_bytes(out), 1);
    // The sender posts twice before the receiver looks: no signal is lost.
    send_post(&send).unwrap();
    send_post(&send).unwrap();
    assert_eq!(recv_post(&recv, 8, t).unwrap(), 2);
    assert_eq!(recv_post(&recv, 8, t).unwrap(), 3);
    assert_eq!(send_wait(&send, t).unwrap(), 3);
    // Nothing posted: the receiver times out without consuming a transfer number.
    let err = recv_post(&recv, 8, Duration::from_millis(5)).unwrap_err();
    assert!(err.message.contains("transfer 4"), "{err}");
    send_post(&send).unwrap();
    assert_eq!(recv_post(&recv, 8, t).unwrap(), 4);
}

#[test]
fn waits_stop_at_once_when_the_peer_has_exited() {
    let slab = new_slab("unit_p2p", crate::host::tests::fdpass_pair("unit_p2p").0).unwrap();
    let a = alloc_for_job("unit_p2p", 8).unwrap();
    let b = alloc_for_job("unit_p2p", 8).unwrap();
    let (mut send, mut recv) = pair(a.addr(), b.addr(), 8, &slab);
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    for h in [&mut send, &mut recv] {
        h.peer = crate::node::PeerProcess {
            rank: 5,
            pid,
            checkable: true,
        };
    }
    // Far below the timeout: the dead peer is noticed at the first liveness check.
    let t = Duration::from_secs(60);
    let start = std::time::Instant::now();
    let err = recv_post(&recv, 8, t).unwrap_err();
    assert_eq!(err.status, crate::error::Status::Io, "{err}");
    assert!(err
        .message
        .contains(&format!("peer rank 5 (pid {pid}, which has exited)")));
    // A timeout names the peer as well.
    recv.peer.checkable = false;
    let err = recv_post(&recv, 8, Duration::from_millis(5)).unwrap_err();
    assert!(
        err.message.contains(&format!("peer rank 5 (pid {pid})")),
        "{err}"
    );
    send_post(&send).unwrap();
    let err = send_wait(&send, t).unwrap_err();
    assert!(err.message.contains("has exited"), "{err}");
    assert!(start.elapsed() < t / 2, "{:?}", start.elapsed());
}

#[test]
fn rejects_bad_handles() {
    let slab = new_slab("unit_p2p", crate::host::tests::fdpass_pair("unit_p2p").0).unwrap();
    let a = alloc_for_job("unit_p2p", 8).unwrap();
    let b = alloc_for_job("unit_p2p", 8).unwrap();
    let (mut send, recv) = pair(a.addr(), b.addr(), 8, &slab);
    assert!(recv_post(&recv, 9, Duration::ZERO).is_err());
    assert!(recv_post(&recv, 0, Duration::ZERO).is_err());
    send.kind = MemKind::Device;
    assert!(send_post(&send).unwrap_err().message.contains("device"));
    send.kind = MemKind::Host;
    send.peer_semaphore = 0;
    assert!(send_post(&send).is_err());
}
