//! Linux namespaces as `/proc` names them: the one reader of `/proc/PID/ns/*` and of namespace files.
//!
//! Owns a process's namespace ids (`net:[INODE]`, `mnt:[INODE]`, `pid:[INODE]`, what `/proc/PID/ns/KIND`
//! links to), the id of a namespace file an operator names (`/run/netns/NAME`, a bind mount, `/proc/N/ns/pid`),
//! whether a process shares llmprof's namespace of a kind, and the user namespace owning a process's network
//! namespace. What a namespace means to a caller (where a helper library is reachable, which alerts are
//! local) is the caller's. Read-only.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The kinds of namespace llmprof looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Mount namespace (`mnt`): which files a path names.
    Mount,
    /// Network namespace (`net`): sockets, addresses, TCP tables.
    Net,
    /// Pid namespace (`pid`): what a pid means.
    Pid,
    /// User namespace (`user`): who owns the others.
    User,
}

impl Kind {
    /// The name in `/proc/PID/ns/` and in ids.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Mount => "mnt",
            Kind::Net => "net",
            Kind::Pid => "pid",
            Kind::User => "user",
        }
    }
}

/// The id of `pid`'s namespace of `kind`, as its `/proc/PID/ns` link reads (`net:[4026531840]`); None when
/// the process is gone or not visible.
pub fn id_of(pid: u32, kind: Kind) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/{}", kind.name()))
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

/// Whether `pid` is in llmprof's own namespace of `kind` (false when either cannot be read).
pub fn same_as_own(pid: u32, kind: Kind) -> bool {
    let own = std::fs::read_link(format!("/proc/self/ns/{}", kind.name())).ok();
    own.is_some() && own == std::fs::read_link(format!("/proc/{pid}/ns/{}", kind.name())).ok()
}

/// Why a path is not a namespace file.
#[derive(Debug, thiserror::Error)]
pub enum NsFileError {
    /// It cannot be looked at.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A regular file with content (nsfs files and their bind mounts are empty).
    #[error("not a namespace file")]
    NotNamespace,
}

/// The id (`KIND:[INODE]`) of the namespace file at `path` (`/proc/N/ns/KIND`, `/run/netns/NAME` or another
/// bind mount of one).
pub fn id_of_file(path: &Path, kind: Kind) -> Result<String, NsFileError> {
    let m = std::fs::metadata(path)?;
    // nsfs inodes live on their own device; a regular file is a mistake.
    if m.is_file() && m.len() > 0 {
        return Err(NsFileError::NotNamespace);
    }
    Ok(format!("{}:[{}]", kind.name(), m.ino()))
}

/// The inode of llmprof's own user namespace.
pub fn own_user_ns() -> Option<u64> {
    std::fs::metadata("/proc/self/ns/user").ok().map(|m| m.ino())
}

/// The inode of the user namespace owning the network namespace of `pid`, through `ioctl(NS_GET_USERNS)`
/// on `/proc/PID/ns/net`.
pub fn net_owner(pid: u32) -> Option<u64> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let f = std::fs::File::open(format!("/proc/{pid}/ns/net")).ok()?;
    // SAFETY: NS_GET_USERNS takes no argument and returns a new descriptor (or -1).
    let fd = unsafe { libc::ioctl(f.as_raw_fd(), libc::NS_GET_USERNS) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the descriptor was just returned by the ioctl and is owned by nobody else.
    let owner = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    owner.metadata().ok().map(|m| m.ino())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn our_namespaces_are_our_own() {
        let me = std::process::id();
        let net = id_of(me, Kind::Net).unwrap();
        assert!(net.starts_with("net:["), "{net}");
        assert!(same_as_own(me, Kind::Mount));
        assert!(!same_as_own(u32::MAX - 1, Kind::Mount));
        assert_eq!(
            id_of_file(Path::new(&format!("/proc/{me}/ns/net")), Kind::Net).unwrap(),
            net
        );
        assert!(matches!(
            id_of_file(&std::env::current_exe().unwrap(), Kind::Net),
            Err(NsFileError::NotNamespace)
        ));
        assert_eq!(net_owner(me), own_user_ns());
    }
}
