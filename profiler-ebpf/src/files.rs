//! The `files` family (`llmprof_abi::files`): opens, reads, mmaps and closes of model files, decoded at the
//! exit of the `syscalls` programs (no program of its own). An open whose path matches one of the patterns user
//! space wrote into `PATTERNS` is sent and its fd followed in `FILES` until its close. Bounded: the pattern
//! compare loops run at most `MAX_PATTERNS` × `PATTERN_LEN` times.

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::bpf_probe_read_user_str_bytes,
    macros::map,
    maps::{Array, HashMap},
};
use llmprof_abi::{
    EventKind, FileIoEvent, FileOp, FileOpenEvent, FilePattern, MAX_PATTERNS, PATH_LEN, PATTERN_LEN,
    PatternKind, ProbeId, SockKey,
};

use crate::{EVENTS, count, header, syscalls::Inflight};

/// Model-file fds being tracked, by (pid, fd).
#[map]
static FILES: HashMap<SockKey, u8> = HashMap::with_max_entries(4096, 0);

/// Model-file path patterns, written by user space before attaching.
#[map]
static PATTERNS: Array<FilePattern> = Array::with_max_entries(MAX_PATTERNS as u32, 0);

#[inline(always)]
pub(crate) fn open(pid_tgid: u64, inf: &Inflight, path_ptr: u64, flags: u32, ret: i64, dur: u64) {
    let Some(mut e) = EVENTS.reserve::<FileOpenEvent>(0) else {
        count(ProbeId::FileOpen, 1, 0, 1);
        return;
    };
    let p = e.as_mut_ptr();
    // SAFETY: `p` points to a reserved ring-buffer slot of the right size; fields are written before submit.
    let path: &mut [u8; PATH_LEN] = unsafe { &mut (*p).path };
    // SAFETY: reads at most PATH_LEN bytes of user memory into the reservation; faults return an error.
    let n = match unsafe { bpf_probe_read_user_str_bytes(path_ptr as *const u8, path) } {
        Ok(s) => s.len(),
        Err(_) => {
            e.discard(0);
            return;
        }
    };
    if !matches_any(path, n) {
        e.discard(0);
        return;
    }
    // SAFETY: see above.
    unsafe {
        (*p).hdr = header(EventKind::FileOpen, inf.ts_ns, pid_tgid);
        (*p).ret = ret;
        (*p).dur_ns = dur;
        (*p).flags = flags;
        (*p)._pad = 0;
    }
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::FileOpen, 1, 1, 0);
    if ret >= 0 {
        let key = SockKey {
            pid: (pid_tgid >> 32) as u32,
            fd: ret as i32,
        };
        let _ = FILES.insert(&key, &1, 0);
    }
}

/// Whether `path[..n]` matches one of the configured patterns.
#[inline(always)]
fn matches_any(path: &[u8; PATH_LEN], n: usize) -> bool {
    for k in 0..MAX_PATTERNS as u32 {
        let Some(pat) = PATTERNS.get(k) else { continue };
        let len = (pat.len as usize) & (PATTERN_LEN * 2 - 1);
        if len == 0 || len > PATTERN_LEN || len > n {
            continue;
        }
        let start = if pat.kind == PatternKind::Suffix as u32 {
            n - len
        } else if pat.kind == PatternKind::Prefix as u32 {
            0
        } else {
            continue;
        };
        let mut ok = true;
        for i in 0..PATTERN_LEN {
            if i >= len {
                break;
            }
            if path[(start + i) & (PATH_LEN - 1)] != pat.bytes[i] {
                ok = false;
                break;
            }
        }
        if ok {
            return true;
        }
    }
    false
}

#[inline(always)]
fn tracked_file(pid_tgid: u64, fd: u64) -> Option<SockKey> {
    let key = SockKey {
        pid: (pid_tgid >> 32) as u32,
        fd: fd as i32,
    };
    // SAFETY: presence test only.
    unsafe { FILES.get(&key) }.map(|_| key)
}

#[inline(always)]
fn emit_file_io(pid_tgid: u64, inf: &Inflight, op: FileOp, fd: i32, len: u64, ret: i64, dur: u64) {
    let Some(mut e) = EVENTS.reserve::<FileIoEvent>(0) else {
        count(ProbeId::FileIo, 1, 0, 1);
        return;
    };
    e.write(FileIoEvent {
        hdr: header(EventKind::FileIo, inf.ts_ns, pid_tgid),
        op: op as u32,
        fd,
        ret,
        len,
        dur_ns: dur,
    });
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::FileIo, 1, 1, 0);
}

#[inline(always)]
pub(crate) fn io(pid_tgid: u64, inf: &Inflight, op: FileOp, len: u64, ret: i64, dur: u64) {
    if let Some(key) = tracked_file(pid_tgid, inf.args[0]) {
        emit_file_io(pid_tgid, inf, op, key.fd, len, ret, dur);
    }
}

#[inline(always)]
pub(crate) fn mmap(pid_tgid: u64, inf: &Inflight, ret: i64, dur: u64) {
    if let Some(key) = tracked_file(pid_tgid, inf.args[4]) {
        emit_file_io(pid_tgid, inf, FileOp::Mmap, key.fd, inf.args[1], ret, dur);
    }
}

#[inline(always)]
pub(crate) fn close(pid_tgid: u64, inf: &Inflight, ret: i64, dur: u64) {
    if let Some(key) = tracked_file(pid_tgid, inf.args[0]) {
        emit_file_io(pid_tgid, inf, FileOp::Close, key.fd, 0, ret, dur);
        let _ = FILES.remove(&key);
    }
}
