use super::*;
use crate::exchange::request::ChannelKey;
use crate::node::PeerProcess;

fn channel(validity: &Arc<Validity>) -> OpenChannel {
    let info = ChannelInfo {
        key: ChannelKey {
            src: 0,
            dst: 1,
            tag: "t".into(),
            occurrence: 0,
        },
        peer: 1,
        kind: MemKind::Host,
        slot: 0,
        entry: 0,
        fp: 0,
    };
    let handles = P2pHandles {
        kind: MemKind::Host,
        local_ptr: 0x1000,
        local_bytes: 8,
        local_semaphore: 0x2000,
        peer_ptr: 0x3000,
        peer_bytes: 8,
        peer_semaphore: 0x4000,
        epochs: Default::default(),
        peer: PeerProcess {
            rank: 1,
            pid: 0,
            checkable: false,
        },
    };
    let settings = Arc::new(Settings::new(Duration::from_secs(3)));
    OpenChannel::new(handles, Arc::new(info), validity.clone(), 0, settings)
}

#[test]
fn a_bump_makes_earlier_handles_stale_and_later_ones_current() {
    let v = Arc::new(Validity::default());
    let old = channel(&v);
    assert_eq!(old.handles().unwrap().peer_ptr, 0x3000);
    assert!(old.is_send() && old.peer() == 1 && old.tag() == "t");
    assert_eq!(old.timeout(), Duration::from_secs(3));
    v.bump();
    let err = old.handles().unwrap_err();
    assert_eq!(err.status, crate::error::Status::InvalidState);
    assert!(
        err.message.contains("peer 1") && err.message.contains("tag \"t\""),
        "{err}"
    );
    assert!(err.message.contains("re-open the channel"), "{err}");
    let new = channel(&v);
    assert!(new.is_current() && !old.is_current());
}

#[test]
fn failure_and_close_are_final_and_say_so() {
    let v = Arc::new(Validity::default());
    let ch = channel(&v);
    v.fail();
    assert!(ch.handles().unwrap_err().message.contains("failed"));
    v.bump();
    assert_eq!(v.current(), FAILED, "a failed channel stays failed");
    v.close();
    v.fail();
    v.bump();
    assert_eq!(v.current(), CLOSED, "a closed channel stays closed");
    assert!(ch.handles().unwrap_err().message.contains("was freed"));
}
