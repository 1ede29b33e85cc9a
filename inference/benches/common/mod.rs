//! What the engine's benches share: the round count from the command line and the one line per measurement
//! that `cargo xtask bench` reads (it prints medians and ranges; these programs never summarize).

/// Rounds asked for with `--rounds N` (cargo's own `--bench` flag is ignored); 5 by default.
pub fn rounds() -> usize {
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--rounds" {
            return args
                .next()
                .and_then(|n| n.parse().ok())
                .filter(|&n| n > 0)
                .unwrap_or_else(|| fail("--rounds needs a positive number"));
        }
    }
    5
}

/// One measurement of one round: `bench<TAB>NAME<TAB>UNIT<TAB>VALUE`.
pub fn emit(name: &str, unit: &str, value: f64) {
    println!("bench\t{name}\t{unit}\t{value}");
}

/// Nanoseconds this thread has run on a CPU (first field of /proc/thread-self/schedstat): on a loaded machine
/// wall time mostly measures the other processes.
#[allow(dead_code, reason = "not every bench times one thread")]
pub fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// User + system CPU seconds of this process, all threads (from /proc/self/stat, in ticks of 1/100 s).
#[allow(dead_code, reason = "not every bench counts the whole process")]
pub fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_comm = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // Fields 14 and 15 of proc(5) are utime and stime; `after_comm` starts at field 3.
    let ticks = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(14) + ticks(15)) / 100.0
}

/// Ends the bench with `msg` (exit status 2).
pub fn fail(msg: &str) -> ! {
    eprintln!("bench: {msg}");
    std::process::exit(2)
}
