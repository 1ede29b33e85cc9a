//! The egress policy (`--egress-allow`): CIDR blocks, their parsing and membership.
//!
//! Owns only address arithmetic; the connect decoder ([`super`]) uses it to set `allowed`.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An IPv4 or IPv6 network such as `127.0.0.0/8` or `::1/128`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

/// Why a CIDR string was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid CIDR {input:?}: {why} (expected e.g. 10.0.0.0/8 or ::1/128)")]
pub struct CidrError {
    input: String,
    why: &'static str,
}

impl Cidr {
    /// A network from an address and a prefix length; `None` if the prefix is too long for the family.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Self> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(Self { addr, prefix })
    }

    /// The network address as given.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` lies inside this network. An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) is
    /// compared as its IPv4 address.
    pub fn contains(&self, ip: &IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(*ip),
            v4 => *v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                prefix_eq(u32::from(net) as u128, u32::from(ip) as u128, 32, self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => prefix_eq(u128::from(net), u128::from(ip), 128, self.prefix),
            _ => false,
        }
    }

    /// The default allow list: loopback and the private ranges (RFC 1918, RFC 4193 unique local).
    pub fn default_allow() -> Vec<Cidr> {
        [
            "127.0.0.0/8",
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "::1/128",
            "fc00::/7",
        ]
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect()
    }
}

fn prefix_eq(a: u128, b: u128, bits: u32, prefix: u8) -> bool {
    let prefix = u32::from(prefix);
    if prefix == 0 {
        return true;
    }
    let shift = bits - prefix;
    (a >> shift) == (b >> shift)
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| CidrError {
            input: s.to_string(),
            why,
        };
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a.trim().parse().map_err(|_| err("not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .map_err(|_| err("prefix is not a number"))?,
            None => max,
        };
        Cidr::new(addr, prefix).ok_or_else(|| err("prefix longer than the address"))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn v4_membership() {
        let c: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(c.contains(&ip("10.1.2.3")));
        assert!(!c.contains(&ip("11.0.0.1")));
        assert!(!c.contains(&ip("::1")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(&ip("8.8.8.8")));
    }

    #[test]
    fn v6_and_mapped() {
        let c: Cidr = "::1/128".parse().unwrap();
        assert!(c.contains(&ip("::1")));
        assert!(!c.contains(&ip("::2")));
        let lo: Cidr = "127.0.0.0/8".parse().unwrap();
        assert!(lo.contains(&ip("::ffff:127.0.0.1")));
    }

    #[test]
    fn default_allow_flags_public_addresses() {
        let allow = Cidr::default_allow();
        let ok = |s: &str| allow.iter().any(|c| c.contains(&ip(s)));
        assert!(ok("127.0.0.1") && ok("192.168.1.1") && ok("172.20.0.1") && ok("::1"));
        assert!(!ok("8.8.8.8") && !ok("172.32.0.1") && !ok("2001:db8::1"));
    }

    #[test]
    fn bad_input_is_rejected_with_a_hint() {
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        let e = "nope/8".parse::<Cidr>().unwrap_err();
        assert!(e.to_string().contains("expected e.g."));
        assert_eq!("1.2.3.4".parse::<Cidr>().unwrap().prefix(), 32);
    }
}
