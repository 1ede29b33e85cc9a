//! The egress probe's records: a traced process's `connect(2)`, flagged when its address is outside the allow
//! list ([`Cidr`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use llmprof_abi::ConnectEvent;

use super::{Record, read};
use crate::event::EventBody;

mod cidr;

pub use cidr::{Cidr, CidrError};

impl Record for ConnectEvent {}

/// AF_INET6 (include/linux/socket.h).
const AF_INET6: u16 = 10;

/// A connect, `allowed` when its address is in one of `allow`'s networks.
pub(super) fn connect(b: &[u8], allow: &[Cidr]) -> Option<EventBody> {
    let e: ConnectEvent = read(b)?;
    let addr = if e.family == AF_INET6 {
        IpAddr::V6(Ipv6Addr::from(e.addr))
    } else {
        IpAddr::V4(Ipv4Addr::new(e.addr[0], e.addr[1], e.addr[2], e.addr[3]))
    };
    let allowed = allow.iter().any(|c| c.contains(&addr));
    Some(EventBody::Connect {
        addr,
        port: e.port,
        ret: e.ret,
        dur_ns: e.dur_ns,
        allowed,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use llmprof_abi::EventKind;

    use super::super::test_records::{NoMachine, bytes, hdr};
    use super::super::{Decoded, Decoder};
    use super::*;

    fn connect_to(family: u16, addr: [u8; 16]) -> ConnectEvent {
        ConnectEvent {
            hdr: hdr(EventKind::Connect),
            ret: 0,
            dur_ns: 3,
            fd: 4,
            family,
            port: 8080,
            addr,
            allowed: 0,
            _pad: [0; 7],
        }
    }

    #[test]
    fn connect_is_flagged_outside_the_allow_list() {
        let mut d = Decoder::new(vec!["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()]);
        let mut addr = [0u8; 16];
        addr[..4].copy_from_slice(&[127, 0, 0, 1]);
        let Decoded::Event(ev) = d.decode(&bytes(&connect_to(2, addr)), &mut NoMachine) else {
            panic!("expected an event");
        };
        match ev.body {
            EventBody::Connect {
                addr, port, allowed, ..
            } => {
                assert_eq!(addr, IpAddr::V4(Ipv4Addr::LOCALHOST));
                assert_eq!(port, 8080);
                assert!(!allowed);
            }
            other => panic!("expected a connect, got {other:?}"),
        }
        assert_eq!((ev.pid, ev.tid, ev.ts_ns), (10, 11, 5));
        let Decoded::Event(ev) = d.decode(
            &bytes(&connect_to(AF_INET6, Ipv6Addr::LOCALHOST.octets())),
            &mut NoMachine,
        ) else {
            panic!("expected an event");
        };
        assert!(
            matches!(ev.body, EventBody::Connect { addr, allowed: true, .. } if addr == IpAddr::V6(Ipv6Addr::LOCALHOST)),
            "{ev:?}"
        );
    }
}
