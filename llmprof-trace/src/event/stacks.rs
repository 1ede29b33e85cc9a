//! Stack samples after symbolization: the one model every consumer of CPU samples shares (the Perfetto
//! sink's callstacks, the report's top functions, and the merge of Python frames into native stacks).
//!
//! A [`CpuSample`] is a list of [`Frame`]s, innermost first: kernel frames (when the clock fired in the
//! kernel), then user frames. Frames are shared ([`Arc`]) because the symbolizer hands out the same frame
//! for every sample of the same address; a merge step that splices interpreter frames into a native stack
//! just builds a new `Vec` of them. Pure data: symbolization itself lives in capture (`llmprof::symbolize`).

pub mod offcpu;

use std::sync::Arc;

/// What kind of code a frame is (Perfetto's `Frame.Kind`, `protos/perfetto/trace/profiling/profile_common.proto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// Kernel code (symbolized from kallsyms).
    Kernel,
    /// Native user code (ELF symbols / DWARF).
    Native,
    /// An interpreter's frame (e.g. a Python function), spliced into the native stack.
    Interpreted,
    /// Just-in-time compiled code (from a perf map file `/tmp/perf-PID.map`).
    Jit,
}

/// One frame of a sampled stack.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Function name, demangled (`inference::quant::avx2::matmul_rows`); an address the symbolizer could
    /// not resolve reads `[unknown]`, or `module+0xOFFSET` when its mapping is known.
    pub function: Arc<str>,
    /// The module (binary or shared library path, `[kernel]`, `[unknown]`).
    pub module: Arc<str>,
    /// Source file, when debug info (DWARF) or the interpreter gives it.
    pub file: Option<Arc<str>>,
    /// Source line, with `file`.
    pub line: Option<u32>,
    /// Kind of code.
    pub kind: FrameKind,
    /// Address relative to the module's start (file offset for user code, the address itself for the
    /// kernel; 0 for interpreted frames).
    pub rel_pc: u64,
}

/// Module name of kernel frames.
pub const KERNEL_MODULE: &str = "[kernel]";
/// Module (and function) name when an address is in no known mapping.
pub const UNKNOWN: &str = "[unknown]";

impl Frame {
    /// A frame with only a function name and module (interpreted frames, tests).
    pub fn named(function: &str, module: &str, kind: FrameKind) -> Self {
        Self {
            function: Arc::from(function),
            module: Arc::from(module),
            file: None,
            line: None,
            kind,
            rel_pc: 0,
        }
    }
}

/// One on-CPU sample of a thread: where it was when the sampling clock fired.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuSample {
    /// The CPU it ran on.
    pub cpu: u32,
    /// The stack, innermost first (kernel frames, then user frames).
    pub frames: Vec<Arc<Frame>>,
    /// The user stack walk stopped at the record's limit (`llmprof_abi::USER_STACK_MAX`): outer frames are
    /// missing.
    pub truncated: bool,
}

impl CpuSample {
    /// The innermost frame (where the CPU was), if any.
    pub fn leaf(&self) -> Option<&Frame> {
        self.frames.first().map(|f| &**f)
    }
}
